#!/usr/bin/env bash
# Builds the CNCF Distribution registry pinned in go.mod, an htpasswd line writer and a
# token service for its token mode into OUT_DIR (default:
# target/tools/bin at the repository root). Go's build and module caches make a rebuild with
# nothing changed take seconds.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-${INPLACE_TOOLS_BIN_DIR:-$here/../../target/tools/bin}}
mkdir -p "$out"
out=$(cd "$out" && pwd)
# One build into OUT_DIR at a time (tests/tools/build.sh too): a test may ask for a tool
# while `make test` builds it beside the tests; it waits, then finds it current.
exec 9>"$out/.build.lock"
flock 9
cd "$here"
# -s -w: no symbol tables; linking is the slowest step of a rebuild.
"$here/../go-build.sh" -ldflags "-s -w" -o "$out/distribution-registry" \
    github.com/distribution/distribution/v3/cmd/registry
echo "$out/distribution-registry"
"$here/../go-build.sh" -ldflags "-s -w" -o "$out/distribution-htpasswd" ./htpasswd
echo "$out/distribution-htpasswd"
"$here/../go-build.sh" -ldflags "-s -w" -o "$out/distribution-token-service" ./tokenservice
echo "$out/distribution-token-service"
