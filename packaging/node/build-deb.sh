#!/usr/bin/env bash
# Builds the agent's Debian/Ubuntu package: OUT_DIR/inplace-agent_<version>_<amd64|arm64>.deb
# (+ a line in OUT_DIR/SHA256SUMS). Inputs are the SAME files the e2e suite installs
# (systemd/, packaging/agent/), never copies; maintainer scripts live in
# packaging/node/deb/. /etc/inplace/agent.toml is a conffile (the commented defaults).
#
# usage: [ARCH=amd64|arm64] build-deb.sh BINARY VERSION OUT_DIR   (ARCH: the binary's)
set -euo pipefail

if [[ $# -ne 3 ]]; then
    echo "usage: $0 BINARY VERSION OUT_DIR" >&2
    exit 2
fi
binary=$1 version=$2 out=$3
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here="$repo/packaging/node/deb"
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 0)}
export SOURCE_DATE_EPOCH=$epoch
arch=${ARCH:-amd64}
name="inplace-agent_${version}_${arch}.deb"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/root"
install -D -m 0755 "$binary" "$root/usr/bin/inplace-agent"
install -D -m 0644 "$repo/systemd/inplace-agent.service" "$root/lib/systemd/system/inplace-agent.service"
install -D -m 0644 "$repo/systemd/inplace-agent.tmpfiles.conf" "$root/usr/lib/tmpfiles.d/inplace-agent.conf"
install -D -m 0644 "$repo/packaging/agent/agent.toml" "$root/etc/inplace/agent.toml"
install -D -m 0644 "$repo/packaging/agent/agent.toml" "$root/usr/share/doc/inplace-agent/agent.toml.example"
install -d -m 0755 "$root/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/${version}/" -e "s/@SIZE@/${size}/" -e "s/@ARCH@/${arch}/" "$here/control.in" > "$root/DEBIAN/control"
install -m 0644 "$here/conffiles" "$root/DEBIAN/conffiles"
for script in postinst prerm postrm; do
    install -m 0755 "$here/$script" "$root/DEBIAN/$script"
done
"$repo/packaging/pack-deb.sh" "$root" "$out" "$name"
echo "$out/$name"
