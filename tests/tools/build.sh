#!/usr/bin/env bash
# Builds the packaging tools pinned in go.mod (crane, helm, oci-image) and krew/go.mod
# (validate-krew-manifest, krew) into OUT_DIR (default: target/tools/bin at the repository root);
# with `oci-image`, only the image writer the node images and the controller image need (a
# small build: `make test` builds it before the tests, the others beside them).
# Go's build and module caches make a rebuild with nothing changed take seconds.
# Usage: tests/tools/build.sh [OUT_DIR [oci-image]]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-${INPLACE_TOOLS_BIN_DIR:-$here/../../target/tools/bin}}
mkdir -p "$out"
# Absolute before the cd below: a relative OUT_DIR means the caller's directory.
out=$(cd "$out" && pwd)
# One build into OUT_DIR at a time (tests/registry/build.sh too): a test may ask for a tool
# while `make test` builds it beside the tests; it waits, then finds it current.
exec 9>"$out/.build.lock"
flock 9
cd "$here"
if [[ ${2:-} == oci-image ]]; then
    "$here/../go-build.sh" -ldflags "-s -w" -o "$out/" ./oci-image
    echo "$out: oci-image"
    exit 0
fi
# -s -w: no symbol tables; linking is the slowest step of a rebuild.
"$here/../go-build.sh" -ldflags "-s -w" -o "$out/" \
    github.com/google/go-containerregistry/cmd/crane helm.sh/helm/v4/cmd/helm ./oci-image
# krew as kubectl runs it, a plugin named kubectl-krew.
(
    cd krew
    "$here/../go-build.sh" -ldflags "-s -w" -o "$out/" sigs.k8s.io/krew/cmd/validate-krew-manifest
    "$here/../go-build.sh" -ldflags "-s -w" -o "$out/kubectl-krew" sigs.k8s.io/krew/cmd/krew
)
echo "$out: crane helm oci-image validate-krew-manifest kubectl-krew"
