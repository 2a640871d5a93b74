# The two commands a newcomer needs: `make demo` (see it work) and `make test` (prove it).
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: test lint unit crds check-crds deps demo

## Every check CI runs: formatting, lints, and every test.
test: deps lint unit

deps:
	@./scripts/install-deps.sh

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit:
	$(CARGO) nextest run --workspace --no-fail-fast

## Regenerate the committed CRDs from the Rust types.
crds:
	$(CARGO) run -q -p inplace-controller -- crds --out packaging/kubernetes/crds
