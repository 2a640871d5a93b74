#!/usr/bin/env bash
# Shell provisioner: installs the agent's .deb into an image root, booted or not.
#   install-deb.sh DEB [ROOT] [CONFIG]
# ROOT (default /): a mounted image root is installed through chroot; there, as in any
# image build without a running systemd, postinst enables the unit and does not start it.
# CONFIG: a file installed as /etc/inplace/agent.toml (default: keep the packaged one).
set -euo pipefail
if [[ $# -lt 1 || $# -gt 3 ]]; then
    echo "usage: $0 DEB [ROOT] [CONFIG]" >&2
    exit 2
fi
deb=$1 root=${2:-/} config=${3:-}
if [[ "$root" == / ]]; then
    dpkg -i "$deb"
else
    cp "$deb" "$root/tmp/inplace-agent.deb"
    chroot "$root" dpkg -i /tmp/inplace-agent.deb
    rm -f "$root/tmp/inplace-agent.deb"
fi
if [[ -n "$config" ]]; then
    install -D -m 0644 "$config" "$root/etc/inplace/agent.toml"
fi
test -L "$root/etc/systemd/system/multi-user.target.wants/inplace-agent.service"
echo "inplace-agent installed and enabled in $root"
