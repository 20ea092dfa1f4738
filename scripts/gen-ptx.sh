#!/usr/bin/env bash
# Regenerates gpu/src/kernel/copy_pages.ptx from copy_pages.ll with LLVM's NVPTX back end (llc, LLVM 14
# or later). The PTX targets sm_70 (PTX 6.4): the driver JIT-compiles it for newer devices (an H200 is
# sm_90) when the crate loads it. `--check` compares instead of writing (the gpu crate's test
# `the_checked_in_ptx_is_what_the_ir_compiles_to` runs the same comparison when llc is installed).
set -euo pipefail
cd "$(dirname "$0")/../gpu/src/kernel"
out=$(llc -O3 -march=nvptx64 -mcpu=sm_70 -mattr=+ptx64 copy_pages.ll -o -)
if [ "${1:-}" = "--check" ]; then
  diff <(printf '%s\n' "$out") copy_pages.ptx && echo "copy_pages.ptx is current"
else
  printf '%s\n' "$out" >copy_pages.ptx
  echo "wrote gpu/src/kernel/copy_pages.ptx"
fi
