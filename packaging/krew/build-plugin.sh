#!/usr/bin/env bash
# Packages the kubectl plugin for krew and for a plain download:
#   OUT_DIR/kubectl-inplace-v<version>-linux-amd64.tar.gz   (+ a line in OUT_DIR/SHA256SUMS)
#   OUT_DIR/inplace.yaml   the krew manifest (packaging/krew/inplace.yaml) for that archive
# Reproducible: every mtime is SOURCE_DATE_EPOCH (default: the last commit's time, else 0).
#
# usage: build-plugin.sh BINARY VERSION OUT_DIR
set -euo pipefail
binary=$1 version=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$here" log -1 --format=%ct 2>/dev/null || echo 0)}
name=kubectl-inplace-v$version-linux-amd64.tar.gz
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
install -m 0755 "$binary" "$stage/kubectl-inplace"
mkdir -p "$out"
tar --sort=name --format=gnu --numeric-owner --owner=0 --group=0 --mtime="@$epoch" \
    -C "$stage" -cf - kubectl-inplace | gzip -n -9 >"$out/$name"
sha=$(sha256sum "$out/$name" | cut -d' ' -f1)
sed -e "s/@VERSION@/$version/g" -e "s/@SHA256@/$sha/" "$here/inplace.yaml" >"$out/inplace.yaml"
"$here/../add-sha256sum.sh" "$out" "$name"
echo "$out/$name"
