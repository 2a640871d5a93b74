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
#
# Go's build cache keeps compiled packages, not linked programs: every fresh clone linked
# each program again (53 CPU-s of a warm `make test`: the control plane and kubectl 16, the
# kubelets 14). So a build with `-o OUTPUT` builds into a directory of its own under
# GO_BIN_CACHE (default: beside Go's build cache), named after the build (the directory it
# runs in, relative to the repository, its environment and its arguments, the output's name
# left out), and copies the program to OUTPUT. `go build` does not link again a program whose
# build ID says it was built from the same inputs; otherwise it links, as it would have.
# Usage: tests/go-build.sh GO-BUILD-ARGUMENT...
set -euo pipefail
build() { GOGC=off go build -trimpath -gcflags=all=-dwarf=false "$@"; }
out=
args=()
while (($#)); do
    if [[ $1 == -o ]]; then
        out=$2
        shift 2
    else
        args+=("$1")
        shift
    fi
done
if [[ -z $out ]]; then
    build "${args[@]}"
    exit
fi
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${GO_BIN_CACHE:-$(dirname "$(go env GOCACHE)")/inplace-go-bin}
key=$(printf '%s\n' "${PWD#"$root"}" "${GOFLAGS:-}" "${CGO_ENABLED:-}" "$(go env GOOS GOARCH)" \
    "${args[@]}" | sha256sum | cut -c1-16)
# Each build's directory holds its programs only: `-o DIR/` writes one per main package.
entry=$cache/$key
mkdir -p "$entry"
# Opening the lock also marks the build as used (its mtime), for the clean-up below.
exec 9>"$entry.lock"
flock 9
# A program is replaced by a rename, never rewritten in place: tests may be running it.
install_program() {
    cmp -s "$1" "$2" && return
    cp "$1" "$2.tmp-$$"
    mv -f "$2.tmp-$$" "$2"
}
if [[ $out == */ ]]; then
    build -o "$entry/" "${args[@]}"
    mkdir -p "$out"
    for program in "$entry"/*; do install_program "$program" "$out${program##*/}"; done
else
    build -o "$entry/program" "${args[@]}"
    # As `go build -o` would: a test may build before anything made the directory.
    mkdir -p "$(dirname "$out")"
    install_program "$entry/program" "$out"
fi
# The builds nobody has made for a month (the pins moved on) are dropped.
find "$cache" -maxdepth 1 -name '*.lock' -mtime +30 -print0 |
    while IFS= read -r -d '' stale; do rm -rf "${stale%.lock}" "$stale"; done
