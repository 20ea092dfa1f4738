#!/usr/bin/env bash
# fuzz-smoke.sh — a short, bounded run of each fuzz target: `ops` (fuzz/fuzz_targets/ops.rs), then
# `capi` (fuzz/fuzz_targets/capi.rs), each for the given seconds.
#
# `ops` decodes any byte string into a scheduler configuration and a sequence of operations
# (submit, pass, complete, finish, cancel, in-flight marks, updates, injected KV and adapter faults) on
# the built-in pool or on KV groups (a full-attention group and 1 or 2 sliding-window groups; the seeds
# seed-groups-* start there),
# runs them against the real scheduler and the naive model of kvsched-testkit (testkit/src/lib.rs) — the
# same harness as the property tests in core/tests/model.rs — and checks every invariant after every operation,
# then that the remaining requests finish or a deadlock is reported.
#
# `capi` decodes any byte string into a sequence of C ABI calls (every function of capi/include/kvsched.h)
# with random arguments, null pointers and buffers exactly as long as their counts, and checks that every
# status is one of the header's codes, that a refused call changes nothing (the engine's fingerprint and
# the arrays handed out before it), and what comes back is in range (docs/RELIABILITY.md).
#
# Any broken invariant, panic, overflow or (with AddressSanitizer) memory error or leak is a crash;
# libFuzzer then writes the input to fuzz/artifacts/TARGET/ and this script exits non-zero. Replay one
# with
#     RUSTC_BOOTSTRAP=1 cargo fuzz run TARGET fuzz/artifacts/TARGET/crash-…
# (`KVSCHED_FUZZ_TRACE=1` makes `capi` print each call and its status.)
#
# Usage: scripts/fuzz-smoke.sh [SECONDS]     (default 60, per target; each run starts from the target's
#                                             committed seeds, fuzz/corpus/TARGET/seed-*, in a scratch
#                                             copy, so the repository's corpus stays small)
# Prints, per target, libFuzzer's DONE line (executions, `cov:` edges, `ft:` features) and its stats.
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
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

for target in ops capi; do
    corpus="$scratch/$target"
    mkdir -p "$corpus"
    cp "fuzz/corpus/$target"/seed-* "$corpus"/
    cargo fuzz build "$target"
    log="$scratch/$target.log"
    start=$(date +%s)
    set +e
    cargo fuzz run "$target" "$corpus" -- -max_total_time="$secs" -max_len=1024 -print_final_stats=1 >"$log" 2>&1
    status=$?
    set -e
    elapsed=$(( $(date +%s) - start ))
    echo "-- fuzz target $target (${elapsed}s)"
    grep -E '^(#[0-9]+[[:space:]]+(INITED|DONE)|Done [0-9]+ runs|stat::(number_of_executed_units|peak_rss_mb|new_units_added))' "$log" || true
    if [ "$status" -ne 0 ]; then
        tail -n 60 "$log" >&2
        echo "fuzz-smoke: the fuzz target $target failed (exit $status); the input is in fuzz/artifacts/$target/" >&2
        exit "$status"
    fi
done
echo "fuzz-smoke: no crash in ${secs}s per target (ops, capi)"
