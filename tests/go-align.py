#!/usr/bin/env python3
"""Gives every Go module of the test beds the same version of each module they share.

Go's build cache keys a compiled package on the compiled packages under it, so a package
compiles once for all the beds only if every module below it is at one version in all of
them: kube-testbed's golang.org/x/sys at v0.40.0 and Cluster API's at v0.47.0 made every
Kubernetes package compile twice, once per bed. This raises each shared module to the highest
version any bed selects (`go get`, then `go mod tidy`), round after round until nothing moves.

Left alone: a module a bed replaces (the kubelets' and kube-testbed's Kubernetes staging
modules, pinned to their release by tests/kube/pin.sh), in a kubelet's module every k8s.io
module (each kubelet is its own release's), and the beds `apart` says why. A k8s.io module
of another bed must not be raised above the control plane's release: that is a bed pinned
too new (its tool needs a newer Kubernetes), and this stops there and says so.

Usage: tests/go-align.py [--check]    --check: change nothing, exit 1 if anything would move
"""

import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CONTROL_PLANE = TESTS / "kube"
KREW = TESTS / "tools" / "krew"


def beds():
    """The Go modules of the test beds that share, the control plane first."""
    release = control_plane_release()
    found = sorted(p.parent for p in TESTS.glob("**/go.mod") if "target" not in p.parts)
    return [CONTROL_PLANE] + [d for d in found if d != CONTROL_PLANE and not apart(d, release)]


def control_plane_release():
    return subprocess.run(
        ["go", "list", "-m", "-f", "{{.Version}}", "k8s.io/kubernetes"],
        cwd=CONTROL_PLANE, check=True, capture_output=True, text=True,
    ).stdout.strip()


def apart(bed, release):
    """A bed that keeps its modules' versions: krew, whose last release builds on a Kubernetes
    client of 2019 (its klog does not compile with the go-logr the others need), and a kubelet
    of another minor release than the control plane's, whose dependencies are its release's
    own (v1.35's kubelet does not compile against the cgroup library v1.36's needs)."""
    return bed == KREW or (is_kubelet(bed) and minor(bed.name) != minor(release))


def minor(version):
    return version.split(".")[:2]


def is_kubelet(bed):
    return bed.parent.name == "kubelet"


def selected(bed):
    """{module path: (version, replaced)} of the modules whose packages the bed builds (its
    own packages and its `tool`s), without the bed itself."""
    listed = subprocess.run(
        ["go", "list", "-e", "-deps", "-f", "{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}"
         " {{with .Replace}}{{.Version}}{{end}}{{end}}{{end}}", "./...", "tool"],
        cwd=bed, capture_output=True, text=True,
    )
    if listed.returncode != 0:
        sys.exit(f"go list in {bed}:\n{listed.stderr}")
    modules = {}
    for line in listed.stdout.splitlines():
        path, version, *replacement = line.split()
        modules[path] = (replacement[0], True) if replacement else (version, False)
    return modules


def semver_key(version):
    """A sort key for a module version (pseudo-versions are semver pre-releases)."""
    core, _, pre = version.lstrip("v").split("+")[0].partition("-")
    numbers = tuple(int(n) for n in core.split("."))
    if not pre:
        return numbers, (1,)
    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
    return numbers, (0, parts)


def movable(bed, path, replaced):
    """Not a module the bed replaces, nor a kubelet's k8s.io module (its release's)."""
    return not replaced and not (path.startswith("k8s.io/") and is_kubelet(bed))


def wanted(lists):
    """The highest version of each module that more than one bed selects and may move."""
    versions = {}
    for bed, modules in lists.items():
        for path, (version, replaced) in modules.items():
            if movable(bed, path, replaced):
                versions.setdefault(path, []).append(version)
    return {p: max(v, key=semver_key) for p, v in versions.items() if len(v) > 1}


def moves(lists, want):
    """{bed: [path@version...]}: what each bed must raise."""
    plan = {}
    for bed, modules in lists.items():
        for path, (version, replaced) in modules.items():
            behind = path in want and semver_key(version) < semver_key(want[path])
            if behind and movable(bed, path, replaced):
                plan.setdefault(bed, []).append(f"{path}@{want[path]}")
    return plan


def too_new(lists):
    """k8s.io modules some bed selects above the control plane's release."""
    control_plane = lists[CONTROL_PLANE]
    problems = []
    for bed, modules in lists.items():
        if is_kubelet(bed) or bed == CONTROL_PLANE:
            continue
        for path, (version, _) in modules.items():
            ours = control_plane.get(path)
            if path.startswith("k8s.io/") and ours and semver_key(version) > semver_key(ours[0]):
                problems.append(
                    f"{bed.relative_to(TESTS)}: {path} {version} > the control plane's {ours[0]}"
                )
    return problems


def raise_to(bed, targets):
    """`go get` TARGETS in BED; where one of them needs another module newer than this round
    planned (Go says "X requires Y@v2, not Y@v1"), with that one raised instead."""
    targets = dict(t.split("@", 1) for t in targets)
    for _ in range(20):
        got = subprocess.run(
            ["go", "get", *(f"{p}@{v}" for p, v in targets.items())],
            cwd=bed, capture_output=True, text=True,
        )
        newer = re.findall(r"requires (\S+)@(\S+), not \1@", got.stderr)
        if got.returncode == 0 or not newer:
            break
        targets.update(newer)
    if got.returncode != 0:
        sys.exit(f"go get in {bed}:\n{got.stderr}")
    subprocess.run(["go", "mod", "tidy"], cwd=bed, check=True, capture_output=True)


def main():
    check = sys.argv[1:] == ["--check"]
    for _ in range(6):
        lists = {bed: selected(bed) for bed in beds()}
        problems = too_new(lists)
        if problems:
            sys.exit("a bed needs a newer Kubernetes than the control plane:\n  "
                     + "\n  ".join(problems))
        plan = moves(lists, wanted(lists))
        if not plan:
            print(f"the {len(lists)} Go modules of the test beds select one version of each"
                  " module they share")
            return
        for bed, targets in plan.items():
            print(f"{bed.relative_to(TESTS)}: {' '.join(sorted(targets))}")
            if not check:
                raise_to(bed, targets)
        if check:
            sys.exit("tests/go-align.py would move the modules above: run it, then commit"
                     " go.mod and go.sum")
    sys.exit("the versions still moved after 6 rounds")


if __name__ == "__main__":
    main()
