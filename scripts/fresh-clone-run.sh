#!/usr/bin/env bash
# Times `make test` as CI runs it: a fresh clone of this repository at REV in DIR/src, then
# `CI=true bash .ci/run` in it, with the machine's CPU time read from /proc/stat before and
# after and a sample every 5 s (docs/development/testing.md § Where the time goes).
#   scripts/fresh-clone-run.sh REV DIR          warm: on the machine's caches and seeds
#   scripts/fresh-clone-run.sh --cold REV DIR   as on a new machine: a HOME of its own in
#       DIR/home (a cargo home with only the rustup proxies, empty Go build and module
#       caches, no pip cache, no cargo seeds, no Go program cache) and the nodes' root
#       filesystem cache moved aside while it runs (put back after). rustup's home stays the
#       machine's: its toolchains are downloads, not CPU. Needs about 25 GiB free.
# Writes DIR/log.txt, DIR/rc, DIR/summary.txt (wall, machine CPU-s busy and idle) and
# DIR/sampler.txt; nothing else may run beside it for the figures to mean anything.
set -euo pipefail
cold=false
[[ ${1:-} == --cold ]] && { cold=true; shift; }
(($# == 2)) || { echo "usage: $0 [--cold] REV DIR" >&2; exit 2; }
rev=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)
repo=$(cd "$(dirname "$0")/.." && pwd)
git clone -q "$repo" "$dir/src"
git -C "$dir/src" checkout -q "$rev"

rootfs_cache=/var/cache/inplace-testbed
if $cold; then
    home=$dir/home
    mkdir -p "$home/.cargo/bin" "$home/.config/go"
    for tool in cargo cargo-clippy cargo-fmt clippy-driver rustc rustdoc rustfmt rustup; do
        ln -sf "$(command -v rustup)" "$home/.cargo/bin/$tool"
    done
    # GOFLAGS and GOTOOLCHAIN as the machine sets them.
    cp "$(go env GOENV)" "$home/.config/go/env" 2>/dev/null || true
    # The machine's cargo tools and Go programs off PATH, the new cargo home's on it.
    PATH=$home/.cargo/bin:$(printf '%s' "$PATH" | tr ':' '\n' |
        grep -vxF -e "$HOME/.cargo/bin" -e "$HOME/go/bin" | paste -sd:)
    export PATH RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup} HOME=$home CARGO_HOME=$home/.cargo
    if [[ -e $rootfs_cache ]]; then
        mv "$rootfs_cache" "$rootfs_cache.aside"
        trap 'rm -rf "$rootfs_cache" && mv "$rootfs_cache.aside" "$rootfs_cache"' EXIT
    fi
fi

busy_idle() { awk '/^cpu / {print $2+$3+$4+$7+$8+$9, $5}' /proc/stat; }
read -r busy0 idle0 < <(busy_idle)
start=$(date +%s)
(while sleep 5; do echo "$(($(date +%s) - start)) $(busy_idle) $(df -BG --output=avail / | tail -1)"; done) >"$dir/sampler.txt" &
sampler=$!
rc=0
(cd "$dir/src" && CI=true bash .ci/run) >"$dir/log.txt" 2>&1 || rc=$?
kill "$sampler"
read -r busy1 idle1 < <(busy_idle)
echo "$rc" >"$dir/rc"
ticks=$(getconf CLK_TCK)
printf 'rc %s, %s s, machine CPU-s %s busy, %s idle\n' "$rc" "$(($(date +%s) - start))" \
    "$(((busy1 - busy0) / ticks))" "$(((idle1 - idle0) / ticks))" | tee "$dir/summary.txt"
exit "$rc"
