#!/usr/bin/env bash
# Prints the -ldflags that stamp a Kubernetes binary built from the module proxy with its
# release, as the release's own build does: without them a kubelet reports itself (and its
# Node's status.nodeInfo.kubeletVersion) as v0.0.0-master.
# Usage: tests/kube/ldflags.sh RELEASE
set -euo pipefail
release=${1:?usage: ldflags.sh RELEASE}
major=${release#v}; major=${major%%.*}
minor=${release#v*.}; minor=${minor%%.*}
# -s -w: no symbol tables; the link of a binary this size is the slowest step of a rebuild.
flags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$release -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
echo "$flags"
