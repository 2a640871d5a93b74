#!/usr/bin/env bash
# `make bench`: install the public tools the benchmarks compare against, build release
# binaries, run every measurement, print one table and write docs/benchmarks.md.
# Not a timed test: CI does not gate on it. Arguments go to `inplace-bench all`
# (e.g. --quick, --size-mib 256, --reps 3, --idle-seconds 60, --fleet-nodes 30000).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v nginx >/dev/null || need+=(nginx-light)
command -v curl >/dev/null || need+=(curl)
command -v openssl >/dev/null || need+=(openssl)
command -v hyperfine >/dev/null || need+=(hyperfine)
[ -x /usr/bin/time ] || need+=(time)
command -v systemd-nspawn >/dev/null || need+=(systemd-container)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v mksquashfs >/dev/null || need+=(squashfs-tools)
if [ ${#need[@]} -gt 0 ]; then
    echo "bench: installing ${need[*]}"
    # Install nginx without starting Debian's system service on port 80: the bench starts
    # its own nginx with its own config. policy-rc.d is Debian's switch for that.
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
        ours=1
    fi
    apt-get install -y --no-install-recommends "${need[@]}" >/dev/null 2>&1 ||
        { apt-get update >/dev/null && apt-get install -y --no-install-recommends "${need[@]}" >/dev/null; }
    if [ -n "${ours:-}" ]; then rm -f /usr/sbin/policy-rc.d; trap - EXIT; fi
fi

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
# The `node` profile is what ships to nodes (scripts/package.sh): the agent measured, and the
# fetcher inside `inplace-bench fetch-one`, are the packaged code.
# The agent on its own, as scripts/package.sh builds it: built in one command with the test
# crates, cargo unifies their features into its dependencies (the API emulator's HTTP/2 into
# the HTTP client, 0.8 MiB), and the binary measured would not be the one that ships.
cargo build --profile node -q -p inplace-agent --bin inplace-agent
cargo build --profile node -q -p inplace-bench -p inplace-tests --bin inplace-bench --bin fake-kubelet
cargo run --profile node -q -p inplace-tests --bin inplace-testbed -- build-rootfs --suite bookworm
exec "$CARGO_TARGET_DIR/node/inplace-bench" all "$@"
