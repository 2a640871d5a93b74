#!/usr/bin/env bash
# `make demo`: the local demo fleet. Installs what it needs (systemd-container, debootstrap,
# squashfs-tools, kubectl), builds the release binaries, then runs `inplace-demo` (arguments
# are passed on, e.g. `./scripts/demo.sh --nodes 2 --no-wait`). Needs root: the nodes are
# systemd-nspawn containers. See docs/usage/quickstart.md.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $EUID -ne 0 ]]; then
    echo "inplace demo: run as root (the nodes are systemd-nspawn containers)" >&2
    exit 1
fi

need_apt=()
command -v kubectl >/dev/null || need_apt+=(kubernetes-client)
command -v systemd-nspawn >/dev/null || need_apt+=(systemd-container)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
command -v mksquashfs >/dev/null || need_apt+=(squashfs-tools)
if ((${#need_apt[@]})); then
    echo "==> installing: ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

target="${CARGO_TARGET_DIR:-target}"
echo "==> building (release; the first build takes a few minutes)"
cargo build --release --quiet \
    -p inplace-agent -p inplace-controller -p inplace-tests -p kubectl-inplace -p inplace-demo --bins
exec "$target/release/inplace-demo" --bin-dir "$target/release" "$@"
