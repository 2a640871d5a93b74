#!/usr/bin/env bash
# Builds the container images the real-node test bed imports into every node's containerd (no
# registry outside this machine exists, so nothing is pulled): one static program (pod/main.go)
# under two names, each image holding just it.
#   OUT_DIR/pause.tar      inplace.test/pause:1     the Pods' sandbox (containerd's sandbox_image)
#   OUT_DIR/workload.tar   inplace.test/workload:1  what the tests' and the demo's Pods run
# Docker-load-able tarballs (`ctr -n k8s.io images import` reads them), written by oci-image
# (built by build.sh beside this file). Usage: tests/tools/node-images.sh [OUT_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
target=${CARGO_TARGET_DIR:-$here/../../target}
out=${1:-$target/node-images}
tools=${INPLACE_TOOLS_BIN_DIR:-$target/tools/bin}
mkdir -p "$out"
out=$(cd "$out" && pwd)
[[ -x $tools/oci-image ]] || "$here/build.sh" "$tools" oci-image >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$here" && CGO_ENABLED=0 ../go-build.sh -ldflags "-s -w" -o "$work/pod" ./pod)
for name in pause workload; do
    mkdir -p "$work/$name"
    install -m 0755 "$work/pod" "$work/$name/$name"
    tar --sort=name --format=gnu --numeric-owner --owner=0 --group=0 --mtime=@0 \
        -cf "$work/$name.layer.tar" -C "$work/$name" .
    "$tools/oci-image" --layer "amd64=$work/$name.layer.tar" --tag "inplace.test/$name:1" \
        --entrypoint "/$name" --user 65532:65532 --created 0 \
        --oci-layout "$work/$name.oci" --tarball "amd64=$work/$name.tar"
    mv -f "$work/$name.tar" "$out/$name.tar"
done
echo "$out: pause.tar (inplace.test/pause:1) workload.tar (inplace.test/workload:1)"
