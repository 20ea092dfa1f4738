#!/usr/bin/env bash
# Extra CI gates beyond the README's test command (called by .ci/run):
#  1. `kvsched bench all --json`: every scenario runs (each asserts its outcome) with 0 heap allocations
#     counted during the timed iterations, then the churn scenario (the simulator on the shipped trace,
#     incremental and full passes), well inside a minute;
#  2. the instruction-count regression gate (gungraun/callgrind, scripts/instruction-gate.sh);
#  3. the model tests at 20,000 release cases (about 2 minutes with the build);
#  4. a bounded fuzz run of the operation harness and of the C ABI (scripts/fuzz-smoke.sh, 30 s each).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "-- kvsched bench all --json"
start=$(date +%s)
json=$(cargo run --release -q -- bench all --json)
elapsed=$(( $(date +%s) - start ))
printf '%s\n' "$json"
passes=$(printf '%s\n' "$json" | grep -v '"scenario":"churn"')
lines=$(printf '%s\n' "$passes" | grep -c '"scenario"')
nonzero=$(printf '%s\n' "$passes" | grep -vc '"allocations":0' || true)
churn=$(printf '%s\n' "$json" | grep -c '"scenario":"churn"' || true)
expected=11
if [ "$lines" -lt "$expected" ] || [ "$nonzero" -ne 0 ] || [ "$churn" -ne 1 ]; then
  echo "bench gate: expected $expected scenarios with \"allocations\":0 and the churn line (got $lines lines, $nonzero with allocations, $churn churn)" >&2
  exit 1
fi
echo "bench gate: $lines scenarios, 0 allocations, the churn line, ${elapsed} s (including the release build)"

echo "-- instruction-count gate"
scripts/instruction-gate.sh

echo "-- the model tests at 20,000 release cases (every variant, KV groups included)"
KVSCHED_PROPTEST_CASES=20000 cargo test -q -p kvsched-core --release --test model

echo "-- fuzz smoke"
scripts/fuzz-smoke.sh 30
