#!/usr/bin/env bash
# Builds kube-testbed (etcd, kube-apiserver, kube-controller-manager and kubectl of the release
# pinned in go.mod) into OUT_DIR (default: target/kube/bin at the repository root), with the
# `kubectl` link beside it. Go's build and module caches make a rebuild with nothing changed
# take seconds; the first build downloads the modules and compiles Kubernetes (minutes).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-${INPLACE_KUBE_BIN_DIR:-$here/../../target/kube/bin}}
mkdir -p "$out"
# Absolute before the cd below: a relative OUT_DIR means the caller's directory.
out=$(cd "$out" && pwd)
cd "$here"
release=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
"$here/../go-build.sh" -ldflags "$(./ldflags.sh "$release")" -o "$out/kube-testbed" .
ln -sf kube-testbed "$out/kubectl"
echo "$out/kube-testbed ($release)"
