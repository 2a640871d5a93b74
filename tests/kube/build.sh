#!/usr/bin/env bash
# Builds kube-testbed (etcd, kube-apiserver, kube-controller-manager and kube-scheduler of the
# release pinned in go.mod) and that release's kubectl into OUT_DIR (default: target/kube/bin
# at the repository root). Go's build and module caches make a rebuild with nothing changed
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
# kubectl is the release's own command, a binary of its own: a real-kubelet test runs it twice
# a second while it waits, and inside kube-testbed each run first initialised every package
# of the control plane (130 CPU-ms a run, 55 alone).
rm -f "$out/kubectl"
"$here/../go-build.sh" -ldflags "$(./ldflags.sh "$release")" -o "$out/kubectl" k8s.io/kubernetes/cmd/kubectl
echo "$out/kube-testbed $out/kubectl ($release)"
