#!/usr/bin/env bash
# Builds the real kubelet of every release pinned below tests/kubelet (one Go module per
# release, made by `tests/kube/pin.sh RELEASE tests/kubelet/RELEASE k8s.io/kubernetes/cmd/kubelet`)
# into OUT_DIR/kubelet-RELEASE (default: target/kubelet/bin at the repository root), stamped
# with its release like the control plane (tests/kube/ldflags.sh). The releases share Go's
# build cache with tests/kube: the kubelet of the control plane's release reuses its packages,
# and the packages two releases have in common are compiled once.
# Usage: tests/kubelet/build.sh [OUT_DIR [RELEASE...]]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-${INPLACE_KUBELET_BIN_DIR:-$here/../../target/kubelet/bin}}
shift || true
mkdir -p "$out"
out=$(cd "$out" && pwd)
# One build into OUT_DIR at a time: `make test` builds the kubelets beside the first node
# tests, and a test that asks for one meanwhile waits here, then finds Go's cache full.
exec 9>"$out/.build.lock"
flock 9
releases=("$@")
if ((${#releases[@]} == 0)); then
    for dir in "$here"/v*/; do releases+=("$(basename "$dir")"); done
fi
for release in "${releases[@]}"; do
    [[ -f $here/$release/go.mod ]] || { echo "tests/kubelet/$release/go.mod is missing: tests/kube/pin.sh $release tests/kubelet/$release k8s.io/kubernetes/cmd/kubelet" >&2; exit 1; }
    (cd "$here/$release" &&
        "$here/../go-build.sh" -ldflags "$("$here/../kube/ldflags.sh" "$release")" \
            -o "$out/kubelet-$release" k8s.io/kubernetes/cmd/kubelet)
    echo "$out/kubelet-$release"
done
