#!/usr/bin/env bash
# fuzz-smoke.sh — a short, bounded run of the `ops` fuzz target (fuzz/fuzz_targets/ops.rs).
#
# The target decodes any byte string into a scheduler configuration and a sequence of operations
# (submit, pass, complete, finish, cancel, in-flight marks, updates, injected KV and adapter faults) on
# the built-in pool or on KV groups (a full-attention group and 1 or 2 sliding-window groups; the seeds
# seed-groups-* start there),
# runs them against the real scheduler and the naive model of kvsched-testkit (testkit/src/lib.rs) — the
# same harness as the property tests in core/tests/model.rs — and checks every invariant after every operation,
# then that the remaining requests finish or a deadlock is reported. Any broken invariant, panic,
# overflow or (with AddressSanitizer) memory error is a crash; libFuzzer then writes the input to
# fuzz/artifacts/ops/ and this script exits non-zero. Replay one with
#     RUSTC_BOOTSTRAP=1 cargo fuzz run ops fuzz/artifacts/ops/crash-…
#
# Usage: scripts/fuzz-smoke.sh [SECONDS]     (default 60; the run starts from the committed seeds in a
#                                             scratch copy, so the repository's corpus stays small)
#
# Needs cargo-fuzz (installed here when missing: `cargo install cargo-fuzz --locked`, ~1 min) and a
# C++ compiler for libFuzzer. cargo-fuzz passes nightly-only flags (-Z sanitizer, ...); on a stable
# toolchain RUSTC_BOOTSTRAP=1 allows them, which this script sets.
set -euo pipefail

secs="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "fuzz-smoke: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked --quiet
fi

export RUSTC_BOOTSTRAP=1
corpus="$(mktemp -d)"
trap 'rm -rf "$corpus"' EXIT
cp fuzz/corpus/ops/seed-* "$corpus"/

cargo fuzz build ops
log="$corpus/fuzz.log"
set +e
cargo fuzz run ops "$corpus" -- -max_total_time="$secs" -max_len=1024 -print_final_stats=1 >"$log" 2>&1
status=$?
set -e
grep -E '^(#[0-9]+[[:space:]]+(INITED|DONE)|Done [0-9]+ runs|stat::(number_of_executed_units|peak_rss_mb|new_units_added))' "$log" || true
if [ "$status" -ne 0 ]; then
    tail -n 60 "$log" >&2
    echo "fuzz-smoke: the fuzz target failed (exit $status); the input is in fuzz/artifacts/ops/" >&2
    exit "$status"
fi
echo "fuzz-smoke: no crash in ${secs}s"
