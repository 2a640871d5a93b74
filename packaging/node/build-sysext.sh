#!/usr/bin/env bash
# Builds the agent as a systemd-sysext image, like a sysext-bakery extension:
#   OUT_DIR/inplace-agent-<version>-<x86-64|arm64>.raw  (+ a line in OUT_DIR/SHA256SUMS)
# Contents: /usr/bin/inplace-agent, the unit, tmpfiles.d, the vendor config defaults
# (/usr/lib/inplace/agent.toml) and the extension-release file. Inputs are the SAME files
# the e2e suite installs (systemd/, packaging/agent/), never copies. Reproducible: every
# mtime is SOURCE_DATE_EPOCH (default: the last commit's time, else 0).
#
# usage: [ARCH=amd64|arm64] [COMPRESSION=gzip|zstd] build-sysext.sh BINARY VERSION OUT_DIR
#   ARCH: the binary's, as Kubernetes names it; the image is named and marked as systemd and
#   sysext-bakery name it.
#   COMPRESSION: gzip (the default: every kernel that reads squashfs reads it) or zstd at
#   level 1 (kernels with CONFIG_SQUASHFS_ZSTD; a thirtieth of gzip's CPU for an image a few
#   per cent larger: the test beds pack this way).
set -euo pipefail

if [[ $# -ne 3 ]]; then
    echo "usage: $0 BINARY VERSION OUT_DIR" >&2
    exit 2
fi
binary=$1 version=$2 out=$3
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
command -v mksquashfs >/dev/null || { echo "mksquashfs missing: apt-get install squashfs-tools" >&2; exit 1; }
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 0)}
case ${ARCH:-amd64} in
amd64) systemd_arch=x86-64 ;;
arm64) systemd_arch=arm64 ;;
*) echo "ARCH=$ARCH: amd64 or arm64" >&2; exit 2 ;;
esac
name="inplace-agent-${version}-${systemd_arch}.raw"
case ${COMPRESSION:-gzip} in
gzip) compression=(-comp gzip) ;;
zstd) compression=(-comp zstd -Xcompression-level 1) ;;
*) echo "COMPRESSION=$COMPRESSION: gzip or zstd" >&2; exit 2 ;;
esac

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
install -D -m 0755 "$binary" "$stage/usr/bin/inplace-agent"
install -D -m 0644 "$repo/systemd/inplace-agent.service" "$stage/usr/lib/systemd/system/inplace-agent.service"
install -D -m 0644 "$repo/systemd/inplace-agent.tmpfiles.conf" "$stage/usr/lib/tmpfiles.d/inplace-agent.conf"
install -D -m 0644 "$repo/packaging/agent/agent.toml" "$stage/usr/lib/inplace/agent.toml"
install -d -m 0755 "$stage/usr/lib/extension-release.d"
# ID=_any: any OS may merge it (the binary is static enough: glibc only). The agent is
# not tied to an OS release, unlike a kubernetes sysext.
cat > "$stage/usr/lib/extension-release.d/extension-release.inplace-agent" <<RELEASE
ID=_any
ARCHITECTURE=${systemd_arch}
EXTENSION_RELOAD_MANAGER=1
RELEASE
chmod 0644 "$stage/usr/lib/extension-release.d/extension-release.inplace-agent"

mkdir -p "$out"
rm -f "$out/$name"
mksquashfs "$stage" "$out/$name" -all-root -noappend -quiet -no-progress "${compression[@]}" \
    -mkfs-time "$epoch" -all-time "$epoch" >/dev/null
chmod 0644 "$out/$name"
"$(dirname "$0")/../add-sha256sum.sh" "$out" "$name"
echo "$out/$name"
