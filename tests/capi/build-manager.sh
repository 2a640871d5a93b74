#!/usr/bin/env bash
# Builds Cluster API's core controller manager (the main package sigs.k8s.io/cluster-api/core
# of the release pinned in go.mod, recorded there as a `tool`) into OUT_DIR (default:
# target/capi/bin at the repository root) as `capi-manager`. Built from the module proxy's
# sources, never a prebuilt image; Go's build and module caches are shared with the other
# beds (tests/kube/build.sh), and so are the versions of the modules they have in common
# (tests/go-align.py), so Kubernetes' client packages compile once. The binary is
# rebuilt only when go.mod, go.sum or this script is newer than it.
# Usage: tests/capi/build-manager.sh [OUT_DIR]      (README-manager.md: how to run it)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-${INPLACE_CAPI_BIN_DIR:-$here/../../target/capi/bin}}
mkdir -p "$out"
# Absolute before the cd below: a relative OUT_DIR means the caller's directory.
out=$(cd "$out" && pwd)
bin=$out/capi-manager
# One build at a time: a test may ask for the manager while `make test` builds it beside the
# tests; it waits, then finds it current.
exec 9>"$out/.build.lock"
flock 9
cd "$here"
release=$(go list -m -f '{{.Version}}' sigs.k8s.io/cluster-api)
if [[ -x $bin && $bin -nt go.mod && $bin -nt go.sum && $bin -nt "$here/build-manager.sh" ]]; then
    echo "$bin ($release, up to date)"
    exit 0
fi
# The version the manager reports (`--version`, its logs) is the release's own.
major=${release#v}; major=${major%%.*}
minor=${release#v*.}; minor=${minor%%.*}
pkg=sigs.k8s.io/cluster-api/version
ldflags="-X $pkg.gitVersion=$release -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
ldflags+=" -X $pkg.gitTreeState=clean"
# Write beside the target and rename: an interrupted build never leaves a half binary that
# looks newer than go.mod.
"$here/../go-build.sh" -ldflags "-s -w $ldflags" -o "$bin.tmp-$$" sigs.k8s.io/cluster-api/core
mv -f "$bin.tmp-$$" "$bin"
echo "$bin ($release)"
