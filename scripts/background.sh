#!/usr/bin/env bash
# Runs a command in the CPU time nothing else wants: `make test`'s side checks (lint,
# fuzzing, the arm64 unit tests) beside the builds and suites that decide its wall time.
# `nice` alone is not enough where the kernel groups processes by session (autogroups, on
# by default): a niced process in the session `make` runs in still takes CPU from the nodes'
# sessions. So the command gets a session (and so an autogroup) of its own, which is niced
# too. Usage: scripts/background.sh COMMAND...
set -euo pipefail
if [[ -z ${INPLACE_BACKGROUND_SESSION:-} ]]; then
    INPLACE_BACKGROUND_SESSION=1 exec setsid --wait "$0" "$@"
fi
unset INPLACE_BACKGROUND_SESSION
# The autogroup file exists where the kernel has them; raising its nice is always allowed.
if [[ -w /proc/self/autogroup ]]; then
    echo 19 2>/dev/null >/proc/self/autogroup || true
fi
exec nice -n 19 "$@"
