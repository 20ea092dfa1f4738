#!/usr/bin/env bash
# Instruction-count regression gate: runs the gungraun benches (callgrind instruction counts, deterministic
# for a given toolchain and build) and compares each scenario's count with bench/benches/instructions-baseline.txt
# (the benches are the kvsched-bench package's).
# A count more than TOLERANCE_PCT (default 5) percent above its baseline fails the gate; a count more than
# that below it is reported so the baseline can be lowered (`scripts/instruction-gate.sh --update` rewrites it).
set -euo pipefail
cd "$(dirname "$0")/.."
baseline=bench/benches/instructions-baseline.txt
tolerance=${TOLERANCE_PCT:-5}
if ! command -v valgrind >/dev/null; then
  echo "instruction gate: valgrind is not installed" >&2
  exit 1
fi
if ! command -v gungraun-runner >/dev/null || ! gungraun-runner --version 2>/dev/null | grep -q '0\.20\.0'; then
  cargo install gungraun-runner --version 0.20.0 --locked
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo bench -p kvsched-bench --bench instructions >"$log" 2>&1 || { cat "$log"; exit 1; }
# "instructions::iteration::s1_256 start:(…)" followed by "  Instructions:   47611|…"
current=$(awk '/^instructions::/ { name=$1 } /^  Instructions:/ { split($2, a, "|"); print name, a[1] }' "$log")
if [ "${1:-}" = "--update" ]; then
  printf '%s\n' "$current" >"$baseline"
  echo "instruction gate: baseline rewritten ($(wc -l <"$baseline") benches)"
  exit 0
fi
status=0
while read -r name count; do
  base=$(awk -v n="$name" '$1 == n { print $2 }' "$baseline")
  if [ -z "$base" ]; then
    echo "NEW   $name $count (not in the baseline)"
    continue
  fi
  pct=$(awk -v c="$count" -v b="$base" 'BEGIN { printf "%+.2f", (c - b) * 100 / b }')
  if awk -v c="$count" -v b="$base" -v t="$tolerance" 'BEGIN { exit !(c > b * (1 + t / 100)) }'; then
    echo "WORSE $name $count vs $base ($pct %)"
    status=1
  elif awk -v c="$count" -v b="$base" -v t="$tolerance" 'BEGIN { exit !(c < b * (1 - t / 100)) }'; then
    echo "BETTER $name $count vs $base ($pct %): lower the baseline with --update"
  else
    echo "ok    $name $count vs $base ($pct %)"
  fi
done <<<"$current"
# Speculative decoding's budget (issue 12): S6 (S1-256 with 4 drafts a step on a joint draft pool) stays
# within 1.5 times S1-256's cost; both run 256 requests.
s1=$(awk '$1 == "instructions::iteration::s1_256" { print $2 }' <<<"$current")
s6=$(awk '$1 == "instructions::iteration::s6" { print $2 }' <<<"$current")
ratio=$(awk -v a="$s6" -v b="$s1" 'BEGIN { printf "%.3f", a / b }')
if awk -v r="$ratio" 'BEGIN { exit !(r > 1.5) }'; then
  echo "WORSE S6 costs $ratio times S1-256 (budget 1.5)"
  status=1
else
  echo "ok    S6 costs $ratio times S1-256 (budget 1.5)"
fi
# The incremental pass (issue 30): how a steady pass grows with the batch, and what it saves over the
# full pass (reported, not gated: the target of S1-1024 at most 1.5 times S1-64 is not met, see
# docs/BENCH.md).
inc64=$(awk '$1 == "instructions::incremental::s1_64_incremental" { print $2 }' <<<"$current")
inc1024=$(awk '$1 == "instructions::incremental::s1_1024_incremental" { print $2 }' <<<"$current")
inc256=$(awk '$1 == "instructions::incremental::s1_256_incremental" { print $2 }' <<<"$current")
if [ -n "$inc64" ] && [ -n "$inc1024" ] && [ -n "$inc256" ]; then
  echo "info  incremental S1-1024 costs $(awk -v a="$inc1024" -v b="$inc64" 'BEGIN { printf "%.2f", a / b }') times S1-64; the full S1-256 pass $(awk -v a="$s1" -v b="$inc256" 'BEGIN { printf "%.2f", a / b }') times the incremental one"
fi
# The pass at depth (issue 41 item 5): how the steady pass grows with the waiting queue (reported, not
# gated: the target of 64k waiting at most 1.5 times 1k is not met, see docs/BENCH.md; the 64k queues are
# measured by hand, `cargo bench -p kvsched-bench --bench depth`).
d1=$(awk '$1 == "instructions::depth::depth_1k" { print $2 }' <<<"$current")
d16=$(awk '$1 == "instructions::depth::depth_16k" { print $2 }' <<<"$current")
e1=$(awk '$1 == "instructions::depth::evicting_1k" { print $2 }' <<<"$current")
e16=$(awk '$1 == "instructions::depth::evicting_16k" { print $2 }' <<<"$current")
if [ -n "$d1" ] && [ -n "$d16" ] && [ -n "$e1" ] && [ -n "$e16" ]; then
  echo "info  depth-16k costs $(awk -v a="$d16" -v b="$d1" 'BEGIN { printf "%.2f", a / b }') times depth-1k; evicting-16k $(awk -v a="$e16" -v b="$e1" 'BEGIN { printf "%.2f", a / b }') times evicting-1k"
fi
[ "$status" -eq 0 ] && echo "instruction gate: no scenario regressed by more than $tolerance %"
exit "$status"
