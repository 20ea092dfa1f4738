#!/usr/bin/env bash
# check-timings.sh — the check mode's cost: each of issue 29's target runs, unchecked and with --check,
# one after the other in one invocation (wall seconds from /usr/bin/time, the ratio checked ÷ unchecked),
# printed as the table docs/RELIABILITY.md quotes.
#
# Usage: scripts/check-timings.sh TRACES_DIR   (a folder holding the full traces, which are not
#                                               shipped (data/ has their heads):
#                                               azure2023_AzureLLMInferenceTrace_conv.csv and
#                                               mooncake_fast25_conversation_trace.jsonl)
# Env: MOONCAKE_LIMIT (default 2000): the requests of the 1.2M-host-page Mooncake run (its unchecked
#      run alone does not finish in 10 minutes on the whole trace under overload; issue 30).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
traces="${1:?usage: scripts/check-timings.sh TRACES_DIR (the full Azure and Mooncake conversation traces)}"
cd "$root"
cargo build --release -q
k=target/release/kvsched
limit="${MOONCAKE_LIMIT:-2000}"

wall() { /usr/bin/time -f "%e" "$k" simulate --no-progress "$@" 2>&1 >/dev/null | tail -n 1; }

run() {
    local name="$1"; shift
    local plain checked
    plain=$(wall "$@")
    checked=$(wall "$@" --check)
    printf '| %s | %s | %s | %.1f× |\n' "$name" "$plain" "$checked" "$(echo "$checked / $plain" | bc -l)"
}

echo "| run | unchecked s | --check s | ratio |"
echo "|---|---|---|---|"
run "Azure conversation, --adapters 64" "$traces/azure2023_AzureLLMInferenceTrace_conv.csv" --adapters 64
run "default slice, --max-batch 1" --max-batch 1
run "Mooncake conversation (first $limit), 8,192 GPU + 1.2M host pages" \
    "$traces/mooncake_fast25_conversation_trace.jsonl" --kv-gpu-pages 8192 --tokens-per-block 32 \
    --kv-host-pages 1200000 --limit "$limit"
run "Mooncake conversation, --replicas 8 --route prefix_affinity --remote-store 100000" \
    "$traces/mooncake_fast25_conversation_trace.jsonl" --replicas 8 --route prefix_affinity \
    --remote-store 100000
