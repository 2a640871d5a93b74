#!/usr/bin/env bash
# Starts the real control plane the way a person would (`inplace-testbed kube`), prints its
# version with the pinned kubectl, and applies the shipped manifests to it
# (`kubectl apply -k packaging/kubernetes`), then stops it. Part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d /tmp/inplace-kube-smoke.XXXXXX)
# `make test` passes the one it built with the suites (INPLACE_TESTBED).
testbed=${INPLACE_TESTBED:-}
if [[ -z $testbed ]]; then
    cargo build -q -p inplace-tests --bin inplace-testbed
    testbed=${CARGO_TARGET_DIR:-target}/debug/inplace-testbed
fi
"$testbed" kube --dir "$dir" --node worker-1 >"$dir/testbed.out" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 600); do
    [ -f "$dir/ready" ] && break
    kill -0 $pid 2>/dev/null || { cat "$dir/testbed.out" "$dir"/*.log >&2; exit 1; }
    sleep 0.5
done
[ -f "$dir/ready" ] || { echo "kube-apiserver not ready after 300 s" >&2; tail -n 30 "$dir"/*.log >&2; exit 1; }
export KUBECONFIG=$dir/admin.kubeconfig
kubectl version
kubectl apply -k packaging/kubernetes
kubectl wait --for=condition=Established --timeout=120s -f packaging/kubernetes/crds
kubectl --kubeconfig "$dir/worker-1.kubeconfig" auth whoami
