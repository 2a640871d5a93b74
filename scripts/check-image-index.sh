#!/usr/bin/env bash
# Checks the multi-platform controller image that scripts/build-image.sh wrote when given both
# builds: the OCI layout pushed as a person pushes it (`crane push`) to a registry on loopback
# (`crane registry serve`), its index lists linux/amd64 and linux/arm64, and the arm64 image's
# binary, exported from the registry, runs with the image's own libraries under qemu-user
# (`--version`): the libraries came from the cross toolchain, not from this host.
# usage: scripts/check-image-index.sh [IMAGES_DIR]   (default: as build-image.sh writes it)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
images=${1:-${IMAGES_DIR:-$target/images}}
tools=${INPLACE_TOOLS_BIN_DIR:-$target/tools/bin}
crane=$tools/crane
[[ -x $crane ]] || "$repo/tests/tools/build.sh" "$tools"
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' "$repo/Cargo.toml")

work=$(mktemp -d)
# Created here, not by the background job's redirection: that one opens the file only once the
# job has forked, and the loop below may read it before (CI of 35cfb87 failed so).
: >"$work/registry.log"
"$crane" registry serve --address 127.0.0.1:0 2>"$work/registry.log" &
server=$!
trap 'kill "$server"; rm -rf "$work"' EXIT
for _ in $(seq 300); do
    port=$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$work/registry.log")
    [[ -n $port ]] && break
    sleep 0.2
done
[[ -n $port ]] || { echo "crane registry serve did not start: $(cat "$work/registry.log")" >&2; exit 1; }
ref=127.0.0.1:$port/inplace-controller:v$version

if ! "$crane" push "$images/inplace-controller" "$ref" >/dev/null 2>"$work/push.log"; then
    cat "$work/push.log" >&2
    exit 1
fi
platforms=$("$crane" manifest "$ref" | python3 -c '
import json, sys
index = json.load(sys.stdin)
print(" ".join(m["platform"]["os"] + "/" + m["platform"]["architecture"] for m in index.get("manifests", [])))')
if [[ $platforms != "linux/amd64 linux/arm64" ]]; then
    echo "the image's index lists [$platforms], not linux/amd64 and linux/arm64" >&2
    exit 1
fi
mkdir "$work/arm64"
"$crane" export --platform linux/arm64 "$ref" - | tar -x -C "$work/arm64"
ran=$(qemu-aarch64-static -L "$work/arm64" "$work/arm64/usr/bin/inplace-controller" --version)
if [[ $ran != "inplace-controller $version" ]]; then
    echo "the arm64 image's inplace-controller --version printed [$ran]" >&2
    exit 1
fi
echo "$images/inplace-controller: an index of $platforms; the arm64 image runs: $ran"
