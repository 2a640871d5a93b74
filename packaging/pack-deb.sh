#!/usr/bin/env bash
# Finishes a staged package root into OUT_DIR/NAME and its SHA256SUMS line: DEBIAN/md5sums of
# every file, every mtime SOURCE_DATE_EPOCH (default: the last commit's time, else 0), files
# owned by root, xz. Shared by the agent's package (packaging/node/build-deb.sh) and the
# kubectl plugin's (packaging/krew/build-plugin.sh), so both are reproducible the same way.
# usage: pack-deb.sh ROOT OUT_DIR NAME   (ROOT/DEBIAN/control already written)
set -euo pipefail
root=$1 out=$2 name=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$here" log -1 --format=%ct 2>/dev/null || echo 0)}
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z |
    xargs -0 md5sum >DEBIAN/md5sums)
chmod 0644 "$root/DEBIAN/md5sums"
find "$root" -exec touch -h -d "@$epoch" {} +
mkdir -p "$out"
dpkg-deb --root-owner-group -Zxz --build "$root" "$out/$name" >/dev/null
"$here/add-sha256sum.sh" "$out" "$name"
