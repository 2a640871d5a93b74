#!/usr/bin/env bash
# Runs a command in CPU time the tests leave: `make test`'s side checks (lint, fuzzing, the
# arm64 unit tests) and the builds only some tests need (Cluster API's manager, the packaging
# tools), beside the builds and suites that decide its wall time.
# `nice` alone is not enough where the kernel groups processes by session (autogroups, on
# by default): a niced process in the session `make` runs in still takes CPU from the nodes'
# sessions. So the command gets a session (and so an autogroup) of its own, which is niced
# too.
# Usage: scripts/background.sh [--nice N] COMMAND...   (N: 19, the default, takes only CPU
# nothing else wants; 10 comes before 19 and after everything at 0; 0 shares the CPU with
# the tests and each node as one more of them)
set -euo pipefail
level=19
if [[ ${1:-} == --nice ]]; then
    level=$2
    shift 2
fi
if [[ -z ${INPLACE_BACKGROUND_SESSION:-} ]]; then
    INPLACE_BACKGROUND_SESSION=1 exec setsid --wait "$0" --nice "$level" "$@"
fi
unset INPLACE_BACKGROUND_SESSION
# The autogroup file exists where the kernel has them; raising its nice is always allowed.
if [[ -w /proc/self/autogroup ]]; then
    echo "$level" 2>/dev/null >/proc/self/autogroup || true
fi
exec nice -n "$level" "$@"
