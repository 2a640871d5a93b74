#!/usr/bin/env bash
# `go build` as every Go build of the tests runs it (the control plane, the kubelets, Cluster
# API's manager and harness, the packaging tools, the registry, butane, the Pod image's
# program): one set of flags, so that they share Go's build cache, whose entries depend on it.
#   -trimpath                  no machine paths in the binaries
#   -gcflags=all=-dwarf=false  no debug info from the compiler: the links drop it anyway (-w)
#   GOGC=off                   the compiler and linker never collect garbage: the largest
#                              process of the control plane's build peaked at 2.4 GB either way
# From an empty build cache the control plane took 920 CPU-s with Go's defaults and 756 so,
# helm 406 and 338 (docs/development/testing.md § Where the time goes).
# Usage: tests/go-build.sh GO-BUILD-ARGUMENT...
set -euo pipefail
GOGC=off exec go build -trimpath -gcflags=all=-dwarf=false "$@"
