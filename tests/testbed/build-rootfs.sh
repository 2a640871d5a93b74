#!/bin/bash
# Builds the Debian root filesystem that the systemd-nspawn test nodes boot: bookworm
# (systemd 252) by default, or trixie (systemd 257) for what needs a newer systemd
# (systemd-confext, mutable system extensions).
#
# Usage: build-rootfs.sh DEST [MIRROR [SUITE]]
#
# DEST must not exist yet. The tree is built in DEST.tmp-$$ and renamed to DEST only when
# complete, so a crashed or interrupted build never leaves a half-made rootfs behind.
# The Rust test bed (inplace_tests::nspawn::ensure_rootfs) runs this script with the cache
# path derived from a hash of this very file: edit the recipe and the next run rebuilds.
set -euo pipefail

dest=${1:?usage: build-rootfs.sh DEST [MIRROR [SUITE]]}
mirror=${2:-http://deb.debian.org/debian}
suite=${3:-bookworm}
packages=systemd,systemd-sysv,dbus,udev,procps,iproute2,curl,less,util-linux,ca-certificates
case "$suite" in
bookworm)
    # The container runtime of the real Kubernetes nodes (docs/development/test-beds.md § Real
    # Kubernetes nodes): Debian's containerd, runc and CNI plugins. Installed in every bookworm
    # node, started only where a test enables it.
    packages+=,containerd,runc,containernetworking-plugins
    ;;
trixie)
    # systemd-confext is in the systemd package; the trixie nodes run no real kubelet.
    ;;
*)
    echo "build-rootfs.sh: unknown suite '$suite' (bookworm or trixie)" >&2
    exit 1
    ;;
esac

for tool in debootstrap systemd-nspawn; do
    command -v "$tool" >/dev/null || {
        echo "build-rootfs.sh: '$tool' is missing: apt-get install systemd-container debootstrap squashfs-tools" >&2
        exit 1
    }
done
[ "$(id -u)" = 0 ] || { echo "build-rootfs.sh: must run as root (debootstrap)" >&2; exit 1; }

if [ -e "$dest" ]; then
    echo "build-rootfs.sh: $dest already exists" >&2
    exit 0
fi

tmp="$dest.tmp-$$"
trap 'rm -rf --one-file-system "$tmp"' EXIT
mkdir -p "$(dirname "$dest")"
rm -rf --one-file-system "$tmp"

debootstrap --variant=minbase --include="$packages" "$suite" "$tmp" "$mirror"

# --- make it a good test node --------------------------------------------------------------
# A fresh machine-id on every boot of every copy (empty file = "first boot" semantics avoided:
# systemd generates a transient id when the file is empty and /etc is writable).
: >"$tmp/etc/machine-id"
rm -f "$tmp/var/lib/dbus/machine-id"
# Each node writes its own /etc/hostname before it boots.
rm -f "$tmp/etc/hostname"
# Root login on the console without password (debugging with machinectl/nsenter only).
sed -i 's/^root:[^:]*:/root::/' "$tmp/etc/shadow"
# Merge sysexts at boot like Flatcar does, so a reboot brings the active extensions back.
mkdir -p "$tmp/etc/extensions" "$tmp/opt/extensions" "$tmp/var/lib/extensions"
ln -sf /lib/systemd/system/systemd-sysext.service \
    "$tmp/etc/systemd/system/sysinit.target.wants/systemd-sysext.service" 2>/dev/null ||
    { mkdir -p "$tmp/etc/systemd/system/sysinit.target.wants" &&
      ln -sf /lib/systemd/system/systemd-sysext.service \
        "$tmp/etc/systemd/system/sysinit.target.wants/systemd-sysext.service"; }
# Units that only slow a container's boot down or fail in it; "degraded" must mean our units.
for unit in systemd-networkd-wait-online.service systemd-timesyncd.service apt-daily.timer \
    apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer getty@tty1.service \
    systemd-firstboot.service; do
    ln -sf /dev/null "$tmp/etc/systemd/system/$unit"
done
# containerd's package enables it; only real Kubernetes nodes start it (they enable it again).
rm -f "$tmp/etc/systemd/system/multi-user.target.wants/containerd.service"
if [ "$suite" = trixie ]; then
    # Configuration extensions are merged at boot too (systemd >= 254), like system extensions.
    mkdir -p "$tmp/var/lib/confexts"
    mkdir -p "$tmp/etc/systemd/system/sysinit.target.wants"
    ln -sf /usr/lib/systemd/system/systemd-confext.service \
        "$tmp/etc/systemd/system/sysinit.target.wants/systemd-confext.service"
fi
# Journal small and volatile: nodes are throwaway.
mkdir -p "$tmp/etc/systemd/journald.conf.d"
printf '[Journal]\nStorage=volatile\nRuntimeMaxUse=16M\n' \
    >"$tmp/etc/systemd/journald.conf.d/10-testbed.conf"
# Faster failure when something hangs on stop.
mkdir -p "$tmp/etc/systemd/system.conf.d"
printf '[Manager]\nDefaultTimeoutStopSec=10s\n' >"$tmp/etc/systemd/system.conf.d/10-testbed.conf"
apt-get -o RootDir="$tmp" clean >/dev/null 2>&1 || true
rm -rf "$tmp"/var/lib/apt/lists/* "$tmp"/var/cache/apt/*.bin

test -x "$tmp/lib/systemd/systemd" || { echo "build-rootfs.sh: no systemd in $tmp" >&2; exit 1; }
touch "$tmp/.inplace-rootfs-complete"
mv -T "$tmp" "$dest"
trap - EXIT
echo "build-rootfs.sh: built $dest"
