#!/usr/bin/env bash
# `make demo`: the local demo fleet. Installs what it needs (systemd-container, debootstrap,
# squashfs-tools), builds the Kubernetes control plane of the pinned release (tests/kube: etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler and kubectl; needs Go), the real
# kubelets of the demo's two releases (tests/kubelet) and the release binaries, then
# runs `inplace-demo` (arguments are passed on, e.g. `./scripts/demo.sh --nodes 2 --no-wait`);
# with `--agent-update` it also builds the agent at a second version for that step; with
# `--cluster-api` (`make demo DEMO_ARGS=--cluster-api`) Cluster API's core manager (tests/capi)
# and the whole workspace, for the update driven by Cluster API's controllers.
# Needs root: the nodes are systemd-nspawn containers. `--kubeconfig PATH` (`make demo
# KUBECONFIG=PATH`) uses that existing cluster instead of starting one. See
# docs/usage/quickstart.md.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $EUID -ne 0 ]]; then
    echo "inplace demo: run as root (the nodes are systemd-nspawn containers)" >&2
    exit 1
fi

need_apt=()
command -v systemd-nspawn >/dev/null || need_apt+=(systemd-container)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
command -v mksquashfs >/dev/null || need_apt+=(squashfs-tools)
if ((${#need_apt[@]})); then
    echo "==> installing: ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

target="${CARGO_TARGET_DIR:-target}"
kube_bin="${INPLACE_KUBE_BIN_DIR:-$target/kube/bin}"
if ! command -v go >/dev/null; then
    echo "inplace demo: Go is needed to build the Kubernetes control plane (tests/kube): https://go.dev/doc/install" >&2
    exit 1
fi
if [[ -x $kube_bin/kube-testbed ]]; then
    echo "==> building Kubernetes (tests/kube; cached, seconds)"
    ./tests/kube/build.sh "$kube_bin"
else
    echo "==> building Kubernetes from the pinned Go modules (tests/kube): the first build downloads"
    echo "    and compiles etcd, kube-apiserver, kube-controller-manager and kubectl (minutes)"
    # go build -v names each package it compiles (one path a line): show a running count, not
    # a silent wait.
    GOFLAGS=-v ./tests/kube/build.sh "$kube_bin" 2>&1 | awk '
        /^go: downloading/ { downloads++; if (downloads % 50 == 1) printf "    downloading modules (%d) ...\n", downloads; fflush(); next }
        / / { print "    " $0; fflush(); next }  # not a package path: a message, an error
        { packages++; if (packages % 200 == 0) printf "    %d packages compiled ...\n", packages; fflush() }'
fi
# kubectl of the cluster's release, for the demo's hints and for you.
export PATH="$(cd "$kube_bin" && pwd):$PATH"

# The nodes' real kubelets (v1 and v2 of the demo) and the container images they import.
echo "==> building the real kubelets v1.36.1 and v1.36.3 from Kubernetes' Go module (tests/kubelet;"
echo "    cached; the first build compiles them, minutes) and the nodes' container images"
./tests/kubelet/build.sh "$target/kubelet/bin" v1.36.1 v1.36.3
./tests/tools/node-images.sh "$target/node-images" >/dev/null

if [[ " $* " == *" --cluster-api "* ]]; then
    # Cluster API's core manager from its Go module (tests/capi; cached, seconds once built),
    # and every program of the workspace: the bed runs the extension and its providers from
    # the build beside the demo (inplace_tests::workspace_build).
    echo "==> building Cluster API's core controller manager (tests/capi; cached; the first build takes minutes)"
    ./tests/capi/build-manager.sh "$target/capi/bin"
    echo "==> building (release; the first build takes a few minutes)"
    cargo build --release --quiet --workspace --bins
else
    echo "==> building (release; the first build takes a few minutes)"
    cargo build --release --quiet \
        -p inplace-agent -p inplace-controller -p kubectl-inplace -p inplace-demo --bins
fi
agent_args=()
if [[ " $* " == *" --agent-update "* ]]; then
    # The demo's agent v2 is this tree built at another version (INPLACE_AGENT_VERSION, the
    # version inplace_agent::build_version reports), in a target directory of its own so
    # that the v1 agent above stays as it is. A first build compiles the agent's
    # dependencies again (release; minutes).
    v1=$("$target/release/inplace-agent" --version | cut -d' ' -f2)
    # One patch above v1, pre-release next.2 (inplace_tests::agent_images::next_version): an
    # update must be above the running version, or the nodes refuse it as a downgrade.
    IFS=. read -r major minor patch <<<"${v1%%[-+]*}"
    v2="$major.$minor.$((patch + 1))-next.2"
    echo "==> building agent $v2 for --agent-update (release, $target/agent-versions; the first build takes a few minutes)"
    INPLACE_AGENT_VERSION=$v2 cargo build --release --quiet -p inplace-agent --bin inplace-agent \
        --target-dir "$target/agent-versions"
    mkdir -p "$target/agent-versions/bin"
    cp "$target/agent-versions/release/inplace-agent" "$target/agent-versions/bin/inplace-agent-$v2"
    agent_args=(--agent-bin-dir "$target/agent-versions/bin")
fi
exec "$target/release/inplace-demo" --bin-dir "$target/release" "${agent_args[@]}" "$@"
