#!/usr/bin/env python3
"""Carries the compiled dependencies of a cargo target directory from one run to the next.

A fresh clone compiles the same registry crates (the kube stack, tokio, hyper, k8s-openapi)
in each of its three builds: the tests', the aarch64 one and the nightly fuzz build. Go's
build cache keeps its compiled packages from clone to clone; this keeps cargo's, by cargo's
own rules. `save` copies out of a target directory every unit that is not one of this
repository's packages (its `.fingerprint/`, `build/` and `deps/` entries, times kept);
`restore` copies them into the next clone's target directory before its build. cargo then
finds each one fresh, or builds it again, as it would have in the directory it came from: a
unit's hash names the crate's version, features, profile, target and compiler, not the
clone's path. The repository's own packages are never carried: each clone compiles them.

Usage: cargo-seed.py save|restore NAME TARGET_DIR
The units are kept in $CARGO_SEED_DIR/NAME (`make test` sets it); without CARGO_SEED_DIR
this does nothing. docs/development/testing.md § Where the time goes.
"""

import fcntl
import json
import os
import re
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# `<name>-<16 hex digits>`: the unit hash cargo puts in the name of each of a unit's entries.
UNIT_HASH = re.compile(r"-([0-9a-f]{16})(?:\.|$)")
CARRIED = (".fingerprint", "build", "deps")


def own_packages():
    """The packages of this repository (the workspace's and the fuzz crate), read from their
    manifests: each clone compiles these itself."""
    names = set()
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in ("target", ".git")]
        if "Cargo.toml" in filenames:
            with open(os.path.join(dirpath, "Cargo.toml")) as manifest:
                package = re.search(r'^\[package\][^\[]*?^name\s*=\s*"([^"]+)"', manifest.read(), re.M)
            if package:
                names.add(package.group(1))
    return names


def profile_dirs(target):
    """The directories of `target` that cargo keeps units in: `debug` (also the build scripts
    of a cross build) and `<triple>/debug`; not a target directory nested in it."""
    for relative in ["debug"] + [os.path.join(d, "debug") for d in os.listdir(target) if d.count("-") >= 2]:
        if os.path.isdir(os.path.join(target, relative, ".fingerprint")):
            yield relative


def compiler(fingerprint):
    """The hash of the compiler a unit was built with, from its fingerprint directory's record
    (None when it has none yet)."""
    for entry in os.listdir(fingerprint):
        if entry.endswith(".json"):
            with open(os.path.join(fingerprint, entry)) as record:
                return json.load(record).get("rustc")
    return None


def units(profile):
    """Each unit of `profile` by its hash: its package and the compiler that built it (a unit's
    fingerprint directory is `<package>-<hash>`; its other entries carry the same hash)."""
    fingerprints = os.path.join(profile, ".fingerprint")
    for entry in os.listdir(fingerprints):
        package, _, unit = entry.rpartition("-")
        yield unit, package, compiler(os.path.join(fingerprints, entry))


def carried_units(found, own):
    """The hashes of the units in `found` (each profile's [`units`]) that belong to no package
    of `own` and were built by the compiler that built `own`'s: what a run restored is kept
    again only while its compiler builds the repository, so an earlier toolchain's units (3 GB
    a set) are not carried forever."""
    listed = [unit for profile in found.values() for unit in profile]
    compilers = {built_by for _, package, built_by in listed if package in own and built_by}
    return {
        unit
        for unit, package, built_by in listed
        if package not in own and (not compilers or built_by in compilers)
    }


def entries(profile, carried):
    """The entries of `profile`'s `.fingerprint/`, `build/` and `deps/` of the `carried` units."""
    for kind in CARRIED:
        directory = os.path.join(profile, kind)
        for entry in os.listdir(directory) if os.path.isdir(directory) else []:
            unit = UNIT_HASH.search(entry)
            if unit and unit.group(1) in carried:
                yield os.path.join(kind, entry)


def copy(source, destination):
    """`source` (a file or a tree) to `destination`, times kept, nothing already there replaced."""
    if os.path.isdir(source) and not os.path.islink(source):
        os.makedirs(destination, exist_ok=True)
        for entry in os.listdir(source):
            copy(os.path.join(source, entry), os.path.join(destination, entry))
        shutil.copystat(source, destination)
    elif not os.path.lexists(destination):
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        shutil.copy2(source, destination, follow_symlinks=False)


def save(target, seed):
    """Replaces `seed` with the dependencies' units of `target`."""
    if not os.path.isdir(target):
        return f"nothing built in {target}"
    found = {profile: list(units(os.path.join(target, profile))) for profile in profile_dirs(target)}
    carried = carried_units(found, own_packages())
    fresh, old = seed + ".new", seed + ".old"
    shutil.rmtree(fresh, ignore_errors=True)
    count = 0
    for profile in found:
        for entry in entries(os.path.join(target, profile), carried):
            relative = os.path.join(profile, entry)
            copy(os.path.join(target, relative), os.path.join(fresh, relative))
            count += 1
    shutil.rmtree(old, ignore_errors=True)
    if os.path.isdir(seed):
        os.rename(seed, old)
    os.rename(fresh, seed)
    shutil.rmtree(old, ignore_errors=True)
    return f"kept {count} units' entries of {target}"


def restore(target, seed):
    if not os.path.isdir(seed):
        return f"none kept yet: {target} is built from the start"
    copy(seed, target)
    return f"{target} starts from the dependencies kept by the last run"


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("save", "restore"):
        sys.exit("usage: cargo-seed.py save|restore NAME TARGET_DIR")
    action, name, target = sys.argv[1:]
    seeds = os.environ.get("CARGO_SEED_DIR")
    if not seeds:
        return
    os.makedirs(seeds, exist_ok=True)
    # One run at a time reads or replaces a seed: runs in two clones may overlap.
    with open(os.path.join(seeds, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        said = {"save": save, "restore": restore}[action](target, os.path.join(seeds, name))
    print(f"cargo-seed {name}: {said}")


if __name__ == "__main__":
    main()
