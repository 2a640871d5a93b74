#!/usr/bin/env bash
# Installs what the tests need on a fresh machine of this project's kind (Debian bookworm,
# root, Rust by rustup, Go). Idempotent and quick when everything is there. kubectl is not
# installed here: the suites use the one built with kube-apiserver from the pinned release
# (tests/kube, `make kube`).
set -euo pipefail

if ! command -v go >/dev/null; then
    echo "Go is missing: the real Kubernetes control plane of the tests is built from its Go modules" >&2
    echo "(tests/kube/go.mod names the Go version). Install Go, then run make again." >&2
    exit 1
fi

need_apt=()
command -v systemd-nspawn >/dev/null || need_apt+=(systemd-container)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
command -v mksquashfs >/dev/null || need_apt+=(squashfs-tools)
command -v minisign >/dev/null || need_apt+=(minisign) # docs/usage/agent-updates.md signs with it
command -v nsenter >/dev/null || need_apt+=(util-linux)
command -v systemctl >/dev/null || need_apt+=(systemd)
[[ -f /etc/ssl/certs/ca-certificates.crt ]] || need_apt+=(ca-certificates) # the controller image's
if ((${#need_apt[@]})); then
    echo "installing: ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
# The arm64 builds (`--arm64`, run by `make arm64-unit` beside the tests): Debian's cross
# compiler and qemu-user, and Rust's standard library for aarch64.
if [[ ${1:-} == --arm64 ]]; then
    need_cross=()
    command -v aarch64-linux-gnu-gcc >/dev/null || need_cross+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
    command -v qemu-aarch64-static >/dev/null || need_cross+=(qemu-user-static)
    if ((${#need_cross[@]})); then
        echo "installing: ${need_cross[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_cross[@]}" >/dev/null
    fi
    rustup target list --installed | grep -q ^aarch64-unknown-linux-gnu ||
        rustup target add aarch64-unknown-linux-gnu
    exit 0
fi
# The cargo tools are built from source on a new machine. They share one target directory
# (their common dependencies build once) and skip their release profiles' link-time
# optimisation (cargo-deny's is fat LTO in one codegen unit): test tools that run for
# seconds, where the build cost minutes (docs/development/testing.md § Where the time goes).
tools_target=$(mktemp -d)
install_tool() {
    command -v "$1" >/dev/null && return
    CARGO_TARGET_DIR=$tools_target CARGO_PROFILE_RELEASE_LTO=false \
        CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 cargo install "$1" --locked
}
# The fuzzing tools (`--fuzz`) are installed by `make fuzz-short` itself, which `make test`
# runs beside the tests: their build then fills the CPU the node tests leave idle.
if [[ ${1:-} == --fuzz ]]; then
    install_tool cargo-fuzz
    rustup toolchain list | grep -q ^nightly || rustup toolchain install nightly --profile minimal
else
    install_tool cargo-nextest
    install_tool cargo-deny
fi
rm -rf "$tools_target"
