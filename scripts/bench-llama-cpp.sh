#!/usr/bin/env bash
# kvsched's CPU engine beside llama.cpp, in one run, on the same GGUF file and thread counts.
#
#   scripts/bench-llama-cpp.sh            # model: $KVSCHED_MODEL, else scripts/fetch-model.sh
#
# 1. Builds llama-cpp-python 0.3.36 from source (llama.cpp compiled here, without native tuning:
#    the native build crashed on this machine kind at its first eval) into target/llama-venv, never
#    the system Python. Its Python dependencies come as wheels; llama.cpp itself is never a binary.
#    A venv that already imports llama_cpp 0.3.36 is reused.
# 2. llama.cpp on 2 and 1 threads: prefill of 128 tokens (one eval of the batch) and single-stream
#    greedy decode of 32 tokens after a chat prompt (the evals' time only), median of 3 runs.
# 3. kvsched: `cargo bench -p kvsched-engine --bench serve` (engine/benches/serve.rs), its
#    `serve-bench` lines (serial, 8 batched, single-stream decode, prefill of 128 tokens).
# 4. The table and the two ratios: llama.cpp's decode over ours (target at most 1.5) and our
#    8-batched throughput over llama.cpp's single stream (target above 1).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv="$root/target/llama-venv"
py="$venv/bin/python"
model="${KVSCHED_MODEL:-$(scripts/fetch-model.sh)}"
[ -f "$model" ] || { echo "bench-llama-cpp: model file $model is missing" >&2; exit 1; }

if ! "$py" -c 'import llama_cpp, sys; sys.exit(llama_cpp.__version__ != "0.3.36")' 2>/dev/null; then
  echo "bench-llama-cpp: building llama-cpp-python 0.3.36 from source into $venv (several minutes)" >&2
  python3 -m venv "$venv"
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DGGML_OPENMP=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL=2 \
    "$venv/bin/pip" install --disable-pip-version-check --quiet \
      --no-binary llama-cpp-python llama-cpp-python==0.3.36 >&2
fi

llama_rows=$(mktemp)
trap 'rm -f "$llama_rows"' EXIT
for threads in 2 1; do
  "$py" - "$model" "$threads" >>"$llama_rows" <<'EOF'
import statistics, sys, time
import numpy as np
from llama_cpp import Llama

path, threads = sys.argv[1], int(sys.argv[2])
llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=512, n_batch=512,
            verbose=False)
text = ("Write a short story about a dragon who paints. Explain how a bicycle stays upright. "
        "What are the main causes of the seasons on Earth? ") * 8
long = llm.tokenize(text.encode(), add_bos=False)[:128]
assert len(long) == 128
chat = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nWrite a short story about a dragon who paints.<|im_end|>\n"
        "<|im_start|>assistant\n")
prompt = llm.tokenize(chat.encode(), add_bos=False, special=True)

def prefill():
    llm.reset()
    t = time.perf_counter()
    llm.eval(long)
    return 128 / (time.perf_counter() - t)

def decode(n=32):
    llm.reset()
    llm.eval(prompt)
    spent = 0.0
    for _ in range(n):
        # Without logits_all, 0.3.36 keeps no scores: the last row's logits are read from the context.
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
        token = int(np.argmax(logits))
        t = time.perf_counter()
        llm.eval([token])
        spent += time.perf_counter() - t
    return n / spent

prefill(); decode(4)  # warm-up
p = statistics.median(prefill() for _ in range(3))
d = statistics.median(decode() for _ in range(3))
print(f"llama-cpp threads={threads} prefill_tok_s={p:.1f} decode_tok_s={d:.1f}")
EOF
done

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
ours=$(KVSCHED_MODEL="$model" cargo bench -q -p kvsched-engine --bench serve -j 2 | grep '^serve-bench ')

"$py" - "$llama_rows" <<EOF
import sys
def fields(line):
    return dict(f.split("=", 1) for f in line.split()[1:])
llama = {r["threads"]: r for r in map(fields, open(sys.argv[1]).read().splitlines())}
ours = {r["threads"]: r for r in map(fields, """$ours""".splitlines())}
print("| threads | llama.cpp prefill-128 tok/s | kvsched prefill-128 tok/s | llama.cpp decode tok/s "
      "| kvsched decode tok/s (1 stream) | kvsched 8 batched tok/s | llama decode / ours | ours 8-batched / llama decode |")
print("|---|---|---|---|---|---|---|---|")
for t in sorted(llama, reverse=True):
    l, o = llama[t], ours.get(t)
    if o is None:
        continue
    ld, od, ob = float(l["decode_tok_s"]), float(o["decode_tok_s"]), float(o["batched_tok_s"])
    print(f"| {t} | {l['prefill_tok_s']} | {o['prefill_tok_s']} | {ld:.1f} | {od:.1f} | {ob:.1f} "
          f"| {ld / od:.2f}x (target <= 1.5) | {ob / ld:.2f}x (target > 1) |")
EOF
