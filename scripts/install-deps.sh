#!/usr/bin/env bash
# Installs what the tests need on a fresh machine of this project's kind (Debian bookworm,
# root, Rust by rustup, Go). Idempotent and quick when everything is there. kubectl is not
# installed here: the suites use the one built with kube-apiserver from the pinned release
# (tests/kube, `make kube`).
#   install-deps.sh                the system packages, then the cargo tools: all a person needs
#   install-deps.sh --system       the system packages (`make deps`)
#   install-deps.sh --arm64        the aarch64 cross tools (`make deps`)
#   install-deps.sh --cargo-tools  cargo-nextest and cargo-deny
#   install-deps.sh --nextest      cargo-nextest (`make nextest`, which `make prepare` builds
#                                  beside the Go builds)
#   install-deps.sh --deny         cargo-deny (`make lint-tools`, in the background under
#                                  `make test`)
#   install-deps.sh --fuzz         cargo-fuzz and the nightly toolchain (`make fuzz-deps`)
set -euo pipefail

if ! command -v go >/dev/null; then
    echo "Go is missing: the real Kubernetes control plane of the tests is built from its Go modules" >&2
    echo "(tests/kube/go.mod names the Go version). Install Go, then run make again." >&2
    exit 1
fi

apt_install() {
    ((${#@})) || return 0
    echo "installing: $*"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

install_system_packages() {
    local need=()
    command -v systemd-nspawn >/dev/null || need+=(systemd-container)
    command -v debootstrap >/dev/null || need+=(debootstrap)
    command -v mksquashfs >/dev/null || need+=(squashfs-tools)
    command -v minisign >/dev/null || need+=(minisign) # docs/usage/agent-updates.md signs with it
    command -v nsenter >/dev/null || need+=(util-linux)
    command -v systemctl >/dev/null || need+=(systemd)
    [[ -f /etc/ssl/certs/ca-certificates.crt ]] || need+=(ca-certificates) # the controller image's
    apt_install "${need[@]}"
}

# The arm64 builds (`make arm64-unit`, beside the tests): Debian's cross compiler and
# qemu-user, and Rust's standard library for aarch64.
install_cross_tools() {
    local need=()
    command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
    command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
    apt_install "${need[@]}"
    rustup target list --installed | grep -q ^aarch64-unknown-linux-gnu ||
        rustup target add aarch64-unknown-linux-gnu
}

# The cargo tools are built from source on a new machine. Those installed together share
# one target directory (their common dependencies build once), skip their release profiles' link-time
# optimisation (cargo-deny's is fat LTO in one codegen unit) and optimise at level 1: test
# tools that run for seconds, where the build costs minutes of a new machine's first run
# (docs/development/testing.md § Where the time goes).
# install_tool NAME [CARGO-INSTALL-OPTION...]
install_tool() {
    command -v "$1" >/dev/null && return
    CARGO_TARGET_DIR=$tools_target CARGO_PROFILE_RELEASE_LTO=false \
        CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 CARGO_PROFILE_RELEASE_OPT_LEVEL=1 \
        cargo install "$@" --locked
}
# install_unoptimised_tool NAME [CARGO-INSTALL-OPTION...]: a tool whose work is starting
# other programs and waiting, built without optimisation or debug info. cargo-nextest so
# built took 305 CPU-s where its opt-level 1 build took 545, and lists the workspace's tests
# in 3.7 s where the optimised one takes 2.2 (docs/development/testing.md § Where the time
# goes).
install_unoptimised_tool() {
    CARGO_PROFILE_DEV_DEBUG=0 install_tool "$@" --debug
}
# nextest without its default features: they are its self-update (an HTTP client and a TLS
# stack, most of its build) and USDT probes, neither of which a test run uses.
install_nextest() {
    install_unoptimised_tool cargo-nextest --no-default-features
}
tools_target=$(mktemp -d)
trap 'rm -rf "$tools_target"' EXIT

install_cargo_tools() {
    install_nextest
    install_tool cargo-deny
}

# Installed by `make fuzz-short` itself, which `make test` runs beside the tests: their
# build then fills the CPU the node tests leave idle.
install_fuzz_tools() {
    install_unoptimised_tool cargo-fuzz
    rustup toolchain list | grep -q ^nightly || rustup toolchain install nightly --profile minimal
}

case ${1:-all} in
all) install_system_packages && install_cargo_tools ;;
--system) install_system_packages ;;
--arm64) install_cross_tools ;;
--cargo-tools) install_cargo_tools ;;
--nextest) install_nextest ;;
--deny) install_tool cargo-deny ;;
--fuzz) install_fuzz_tools ;;
*) echo "install-deps.sh: unknown option $1 (--system, --arm64, --cargo-tools, --nextest, --deny or --fuzz)" >&2; exit 2 ;;
esac
