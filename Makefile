# The two commands a newcomer needs: `make demo` (see it work) and `make test` (prove it).
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: test lint unit crds docs deps

## Every check CI runs: formatting, lints, and every test.
test: deps lint unit

deps:
	@./scripts/install-deps.sh

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) deny --log-level error check bans licenses sources

unit:
	$(CARGO) nextest run --workspace --no-fail-fast

## Regenerate the committed CRDs from the Rust types.
crds:
	$(CARGO) run -q -p inplace-controller -- crds --out packaging/kubernetes/crds

## Regenerate the reason table in docs/usage/troubleshooting.md.
docs:
	@table=$$($(CARGO) run -q -p inplace-proto --example reasons_table) && \
	python3 -c 'import sys,re; p="docs/usage/troubleshooting.md"; s=open(p).read(); t=sys.argv[1]+"\n"; \
	open(p,"w").write(re.sub(r"(<!-- reasons:begin -->\n).*?(<!-- reasons:end -->)", lambda m: m.group(1)+t+m.group(2), s, flags=re.S))' "$$table"
