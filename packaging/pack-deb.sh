#!/usr/bin/env bash
# Finishes a staged package root into OUT_DIR/NAME and its SHA256SUMS line: DEBIAN/md5sums of
# every file, every mtime SOURCE_DATE_EPOCH (default: the last commit's time, else 0), files
# owned by root, xz at level 1. Shared by the agent's package (packaging/node/build-deb.sh)
# and the kubectl plugin's (packaging/krew/build-plugin.sh), so both are reproducible the
# same way.
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
# xz's level 1, not dpkg-deb's 6: the shipped agent's package is 3.9 MB instead of 3.4, and
# packing the suites' 68 MB debug agent takes 5 CPU-seconds instead of 37 (docs/development/
# testing.md § Where the time goes, session 44). Every dpkg reads xz at any level.
dpkg-deb --root-owner-group -Zxz -z1 --build "$root" "$out/$name" >/dev/null
"$here/add-sha256sum.sh" "$out" "$name"
