#!/usr/bin/env bash
# Builds every node package from a release build of the agent into $CARGO_TARGET_DIR/packages/
# (target/packages/ by default; PACKAGES_DIR overrides):
#   inplace-agent-<version>-x86-64.raw   systemd-sysext image (Flatcar, any sysext host)
#   inplace-agent_<version>_amd64.deb    Debian/Ubuntu package (image-builder)
#   kubectl-inplace-v<version>-linux-amd64.tar.gz and inplace.yaml   the kubectl plugin and
#                                        its krew manifest (packaging/krew)
#   kubectl-inplace_<version>_amd64.deb  the kubectl plugin for Debian/Ubuntu
# (with ARCH=arm64: -arm64.raw, _arm64.deb, linux-arm64.tar.gz; the krew manifest names
# every plugin archive in the directory, so after both runs, in either order, it has both
# platforms: `make packages arm64`)
#   SHA256SUMS
# usage: [ARCH=amd64|arm64] scripts/package.sh [AGENT_BINARY [PLUGIN_BINARY]]   (default:
# cargo build --profile node of inplace-agent and of kubectl-inplace, the size-optimised
# profile in Cargo.toml every node runs; ARCH=arm64 cross-builds them for aarch64 with the
# linker .cargo/config.toml names, and every package is named and marked arm64)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
target=${CARGO_TARGET_DIR:-$repo/target}
out=${PACKAGES_DIR:-$target/packages}
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
export ARCH=${ARCH:-amd64}
case $ARCH in
amd64) cross=() built=$target/node ;;
arm64) cross=(--target aarch64-unknown-linux-gnu) built=$target/aarch64-unknown-linux-gnu/node ;;
*) echo "ARCH=$ARCH: amd64 or arm64" >&2; exit 2 ;;
esac
if [[ $# -ge 1 ]]; then
    binary=$1
else
    ${CARGO:-cargo} build --profile node --locked "${cross[@]}" -p inplace-agent --bin inplace-agent
    binary=$built/inplace-agent
fi
mkdir -p "$out"
packaging/node/build-sysext.sh "$binary" "$version" "$out"
packaging/node/build-deb.sh "$binary" "$version" "$out"
if [[ $# -ge 2 ]]; then
    plugin=$2
else
    ${CARGO:-cargo} build --profile node --locked "${cross[@]}" -p kubectl-inplace --bin kubectl-inplace
    plugin=$built/kubectl-inplace
fi
packaging/krew/build-plugin.sh "$plugin" "$version" "$out"
