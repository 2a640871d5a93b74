#!/usr/bin/env bash
# Records FILE's checksum in DIR/SHA256SUMS (replacing an older line for the same name; lines
# sorted by name), the file a release publishes beside its packages.
# usage: add-sha256sum.sh DIR FILE
set -euo pipefail
cd "$1"
touch SHA256SUMS
grep -v "  ${2}\$" SHA256SUMS >SHA256SUMS.new || true
sha256sum "$2" >>SHA256SUMS.new
sort -k2 SHA256SUMS.new >SHA256SUMS
rm -f SHA256SUMS.new
