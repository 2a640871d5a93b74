#!/usr/bin/env bash
# Runs one step of `make test` and records what it cost, so that every run says where its
# time went (docs/development/testing.md § Where the time goes):
#   scripts/timed.sh STEP COMMAND...   runs COMMAND, appends "STEP wall cpu" (seconds; cpu is
#                                      user + system of the processes it waited for) to the log
#   scripts/timed.sh --start           empties the log and notes when the run started
#   scripts/timed.sh --report          prints each step's wall and CPU time, and the slowest
#                                      tests of the run (from nextest's JUnit file, which
#                                      nextest writes under the repository's target/ always),
#                                      and the run's own wall time: steps run side by side;
#                                      and the disk space left on TARGET's filesystem
# The log is $TARGET/test-steps.tsv, TARGET being CARGO_TARGET_DIR or ./target. While a step
# runs, the free space is sampled every 30 s into $TARGET/test-steps.tsv.disk: a run that
# fills the disk fails in tests that boot nodes, far from the cause, and the report then says it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
log=$target/test-steps.tsv
mkdir -p "$target"
# What a run on a fresh clone writes, Go's and cargo's caches included, with room to spare
# (19.2 GiB measured: docs/development/testing.md § Disk).
NEEDED_GIB=25

free_bytes() { df --output=avail -B1 "$target" | tail -n 1 | tr -d ' '; }

case ${1:-} in
--start)
    : >"$log"
    date +%s >"$log.start"
    free=$(free_bytes)
    echo "$free" >"$log.disk"
    free_gib=$((free >> 30))
    if ((free_gib < NEEDED_GIB)); then
        echo "warning: $free_gib GiB free on $target's filesystem; a run on a fresh clone" \
            "writes up to $NEEDED_GIB GiB (docs/development/testing.md § Disk), and tests that" \
            "boot nodes fail when the disk is full" >&2
    fi
    exit 0
    ;;
--report)
    exec python3 "$(dirname "$0")/test-times.py" "$log" "$root/target/nextest/default/junit.xml"
    ;;
esac

step=$1
shift
# A test that runs a documented `make` command (`make images`, `make tools`) is part of the
# nextest step, not a step of its own.
if [[ -n ${NEXTEST_RUN_ID:-} ]]; then
    exec "$@"
fi
start=$(date +%s.%N)
(while sleep 30; do free_bytes >>"$log.disk"; done) >/dev/null 2>&1 &
sampler=$!
status=0
"$@" || status=$?
end=$(date +%s.%N)
kill "$sampler" 2>/dev/null || true
free_bytes >>"$log.disk"
# `times` prints the shell's own and then its children's user and system time (XmY.Zs); run
# in this shell, not in a command substitution's subshell, which has no children.
# Steps may run side by side (the fuzzing beside the tests): each has its own file.
times >"$log.times.$$"
cpu=$(tail -n 1 "$log.times.$$" | awk '{
    total = 0
    for (i = 1; i <= 2; i++) { split($i, t, /[ms]/); total += t[1] * 60 + t[2] }
    printf "%.1f", total
}')
rm -f "$log.times.$$"
awk -v step="$step" -v start="$start" -v end="$end" -v cpu="$cpu" \
    'BEGIN { printf "%s\t%.1f\t%s\n", step, end - start, cpu }' >>"$log"
exit "$status"
