#!/usr/bin/env bash
# Installs the Ansible pinned in requirements.txt (ansible-core, ansible-lint) into a venv at
# VENV (default: target/ansible/venv at the repository root) and prints its bin directory.
# Cached: a venv built from the same requirements is reused (a stamp holds their sha256);
# the first install downloads from PyPI (about a minute here).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${1:-$here/../../target/ansible/venv}
want=$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)
stamp="$venv/.requirements.sha256"
# One install at a time (the lock beside the venv, which an install removes first): a test
# may ask for the venv while `make test` installs it beside the tests; it waits, then finds
# it current.
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
    echo "$want" > "$stamp"
fi
echo "$venv/bin"
