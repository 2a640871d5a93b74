#!/usr/bin/env bash
# Builds the real Butane pinned in go.mod into OUT_DIR (default: target/butane/bin at the
# repository root). Go's build and module caches make a rebuild with nothing changed take a
# second or two; the first build downloads the modules and compiles (about 15 s here).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../../target/butane/bin}
mkdir -p "$out"
# Absolute before the cd below: a relative OUT_DIR means the caller's directory.
out=$(cd "$out" && pwd)
# One build into OUT_DIR at a time: a test may ask for butane while `make test` builds it
# beside the tests; it waits, then finds it current.
exec 9>"$out/.build.lock"
flock 9
cd "$here"
version=$(go list -m -f '{{.Version}}' github.com/coreos/butane)
"$here/../go-build.sh" -ldflags "-s -w -X github.com/coreos/butane/internal/version.Raw=$version" \
    -o "$out/butane" github.com/coreos/butane/internal
echo "$out/butane ($version)"
