#!/usr/bin/env bash
# The Dynamo worker's CI step (run by .ci/run; docs/DYNAMO.md): Dynamo's build requirements installed
# when missing, the crate formatted, built (its time printed) and tested: Dynamo's conformance kit
# against the engine on SmolLM2, the planted fault, and the end-to-end test (the frontend over two
# workers in a loopback-only network namespace).
#
# dynamo/ is a workspace of its own (its lock file, Dynamo's pins and 900 packages apart from the
# scheduler's); its build folder is cached beside the main one: $KVSCHED_DYNAMO_TARGET, else
# ~/.cache/kvsched/dynamo-target. KVSCHED_MODEL must name the test model (scripts/fetch-model.sh).
set -euo pipefail
cd "$(dirname "$0")/../dynamo"

# protoc and libclang: Dynamo's gRPC and NIXL bindings generate code at build time.
need=()
command -v protoc >/dev/null || need+=(protobuf-compiler)
ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 || ls /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1 ||
  need+=(libclang-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  apt-get install -y -q "${need[@]}" >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q "${need[@]}" >/dev/null; }
fi

export CARGO_TARGET_DIR="${KVSCHED_DYNAMO_TARGET:-${XDG_CACHE_HOME:-$HOME/.cache}/kvsched/dynamo-target}"
export CARGO_INCREMENTAL=0
mkdir -p "$CARGO_TARGET_DIR"

cargo fmt -- --check

began=$(date +%s)
cargo build --locked --tests --bins
echo "the Dynamo worker's build: $(( $(date +%s) - began )) s (build folder $CARGO_TARGET_DIR)"

began=$(date +%s)
cargo test --locked -- --test-threads 1
echo "the Dynamo worker's tests: $(( $(date +%s) - began )) s"
