#!/usr/bin/env bash
# Load-test `kvsched serve` with guidellm (the vLLM project's benchmark tool)
# at a few request rates, and summarize TTFT, ITL/TPOT, throughput and goodput per
# rate, so the numbers can be compared with the simulator on the same request shapes.
#
#   scripts/bench-serve.sh [options] RATE...
#
#   RATE...                 requests per second (constant or poisson), or stream counts
#                           (--rate-type concurrent); none for --rate-type synchronous
#   --url URL               benchmark a server that is already running (e.g. http://127.0.0.1:8000)
#                           default: start `kvsched serve --model "$MODEL" --port 0` here
#   --model FILE            GGUF for the started server and the tokenizer (default: $MODEL,
#                           else $KVSCHED_MODEL, else scripts/fetch-model.sh's test model)
#   --serve-arg ARG         one more argument for `kvsched serve` (repeatable)
#   --endpoint completions|chat   /v1/completions (default here) or /v1/chat/completions
#                           (guidellm's own default). Prefer completions to compare with the
#                           simulator: the prompt reaches the model as exactly --prompt-tokens
#                           tokens, whereas chat adds the chat template's tokens (SmolLM2's
#                           template adds a default system prompt), which the server's usage
#                           then counts (prompt_tokens_p50 in the summary shows what it counted)
#   --rate-type constant|poisson|concurrent|synchronous   (default: constant)
#   --prompt-tokens N       synthetic prompt length, in the tokenizer's tokens (default 128)
#   --output-tokens N       completion length; sent as max_tokens / max_completion_tokens
#                           with ignore_eos: true (default 32)
#   --seconds S             length of each rate's run: N = ceil(rate * S) requests (default 30)
#   --requests N            exactly N requests per rate instead (required-ish for concurrent /
#                           synchronous: default 32 there)
#   --max-seconds S         also stop each rate after S seconds, cancelling requests in flight
#                           (default: none; see the max_duration note below)
#   --request-timeout S     a request that has not finished after S seconds errors (default 300)
#   --slo-ttft-ms X --slo-tpot-ms Y --slo-e2e-ms Z
#                           latency objectives for goodput (any subset; none: no goodput)
#   --tokenizer DIR         a directory holding the model's Hugging Face tokenizer.json
#                           (default: $TARGET/bench-serve/tokenizer, built from the GGUF)
#   --out DIR               where the reports go (default $TARGET/bench-serve/<UTC time>)
#
# Environment: CARGO_TARGET_DIR (build folder, default target), KVSCHED (the kvsched binary,
# default $TARGET/release/kvsched), MODEL or KVSCHED_MODEL, GUIDELLM_WORKERS (guidellm worker processes,
# default 1; its default is min(cores, 10) processes, far too many on 2 cores).
#
# Output per rate i: $OUT/rate-<r>.json (guidellm's full report) and rate-<r>.log; at the
# end $OUT/summary.json, $OUT/summary.tsv (one row per rate) and $OUT/requests.tsv (one
# row per successful request: its scheduled start, start, TTFT, ITL, tokens) for the simulator.
#
# Checked on this machine, offline, with guidellm 0.8.1 against `kvsched serve` (2026-12-02): the venv
# install (torch and its CUDA wheels come with guidellm: ~3.1 GB download, ~5.9 GB on disk, ~1.5 min
# from PyPI), the command lines below, both endpoints, streaming with usage, the report's JSON paths
# read by the summary, goodput with SLOs; the tokenizer (a directory holding only tokenizer.json,
# built here from the GGUF as engine/src/tokenizer.rs builds it) gives guidellm 128-token prompts
# that the server counts as exactly 128 tokens on /v1/completions (158 on chat: the template's).
# What guidellm needs from the server: GET /health 2xx, GET /v1/models (data[0].id becomes
# "model"), its bodies accepted (stream_options {include_usage, continuous_usage_stats},
# ignore_eos, max_completion_tokens, content parts), `data: [DONE]` and a usage chunk.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
case $TARGET in /*) ;; *) TARGET=$ROOT/$TARGET ;; esac
VENV=$TARGET/bench-venv
GUIDELLM_VERSION=0.8.1   # verified; 0.4.0 and later all require torch
GGUF_PY_VERSION=0.19.0   # only to build tokenizer.json from the GGUF when none is given
MODEL=${MODEL:-${KVSCHED_MODEL:-}}   # default (below): scripts/fetch-model.sh, the test model
KVSCHED=${KVSCHED:-$TARGET/release/kvsched}

url="" endpoint=completions rate_type=constant prompt_tokens=128 output_tokens=32
seconds=30 requests="" max_seconds="" request_timeout=300 slo_ttft="" slo_tpot="" slo_e2e=""
tokenizer="" out="" serve_args=() rates=()

die() { echo "bench-serve: $*" >&2; exit 2; }
while (($#)); do
    case $1 in
        --url) url=$2; shift 2 ;;
        --model) MODEL=$2; shift 2 ;;
        --serve-arg) serve_args+=("$2"); shift 2 ;;
        --endpoint) endpoint=$2; shift 2 ;;
        --rate-type) rate_type=$2; shift 2 ;;
        --prompt-tokens) prompt_tokens=$2; shift 2 ;;
        --output-tokens) output_tokens=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --requests) requests=$2; shift 2 ;;
        --max-seconds) max_seconds=$2; shift 2 ;;
        --request-timeout) request_timeout=$2; shift 2 ;;
        --slo-ttft-ms) slo_ttft=$2; shift 2 ;;
        --slo-tpot-ms) slo_tpot=$2; shift 2 ;;
        --slo-e2e-ms) slo_e2e=$2; shift 2 ;;
        --tokenizer) tokenizer=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        --) shift; rates+=("$@"); break ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) rates+=("$1"); shift ;;
    esac
done
case $endpoint in
    chat) request_format=/v1/chat/completions ;;
    completions) request_format=/v1/completions ;;
    *) die "--endpoint is chat or completions" ;;
esac
case $rate_type in
    constant|poisson|concurrent) ((${#rates[@]})) || die "give at least one rate" ;;
    synchronous) ((${#rates[@]} == 0)) || die "synchronous takes no rates"; rates=(sync) ;;
    *) die "--rate-type is constant, poisson, concurrent or synchronous" ;;
esac
[[ -n $MODEL ]] || MODEL=$("$ROOT/scripts/fetch-model.sh")
out=${out:-$TARGET/bench-serve/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"

# --- the virtualenv, with the pinned guidellm (idempotent) ---------------------------------
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('guidellm') != '$GUIDELLM_VERSION')" 2>/dev/null; then
    echo "bench-serve: installing guidellm==$GUIDELLM_VERSION into $VENV (pulls torch with CUDA wheels: ~3 GB download, ~6 GB on disk)" >&2
    python3 -m venv "$VENV"
    # The pins beside guidellm are the versions verified with it (transformers 5 is what
    # loads a directory holding only tokenizer.json).
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "guidellm==$GUIDELLM_VERSION" \
        torch==2.15.0 transformers==5.24.0 tokenizers==0.23.3 datasets==5.2.0 httpx==0.28.1
fi

# Offline: nothing may try the Hugging Face hub (it is unreachable here; with these set a
# stray lookup fails at once instead of retrying).
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false
export GUIDELLM__MAX_WORKER_PROCESSES=${GUIDELLM_WORKERS:-1}

# --- the tokenizer guidellm needs for synthetic prompts -----------------------------------
# guidellm makes each synthetic prompt by encoding faker text with
# transformers.AutoTokenizer.from_pretrained(DIR) and decoding the first N tokens. With
# transformers 5.x a directory holding only tokenizer.json is enough (verified). Without
# --tokenizer, guidellm would use the served model's *name* as a hub id and fail offline.
if [[ -z $tokenizer ]]; then
    tokenizer=$TARGET/bench-serve/tokenizer
    if [[ ! -s $tokenizer/tokenizer.json ]]; then
        [[ -f $MODEL ]] || die "no --tokenizer and no GGUF at $MODEL to build one from"
        "$VENV/bin/python" -c "import gguf" 2>/dev/null ||
            "$VENV/bin/pip" install --quiet --disable-pip-version-check "gguf==$GGUF_PY_VERSION"
        mkdir -p "$tokenizer"
        "$VENV/bin/python" - "$MODEL" "$tokenizer/tokenizer.json" <<'PY'
# Byte-level BPE from the GGUF, as engine/src/tokenizer.rs byte_level_bpe builds it.
import sys
from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
f = GGUFReader(sys.argv[1]).fields
if f["tokenizer.ggml.model"].contents() != "gpt2":
    sys.exit("bench-serve: only byte-level BPE (gpt2) GGUF tokenizers are handled here")
tok = f["tokenizer.ggml.tokens"]
tokens = [tok.contents(i) for i in range(len(tok.data))]
mer = f["tokenizer.ggml.merges"]
merges = [tuple(mer.contents(i).split(" ", 1)) for i in range(len(mer.data))]
types = f["tokenizer.ggml.token_type"].contents() if "tokenizer.ggml.token_type" in f else [1] * len(tokens)
t = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(tokens)}, merges=merges))
t.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Digits(individual_digits=True),
    pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
])
t.decoder = decoders.ByteLevel()
t.add_special_tokens([AddedToken(tokens[i], special=True) for i, k in enumerate(types) if k == 3])
t.save(sys.argv[2])
PY
    fi
fi
[[ -s $tokenizer/tokenizer.json ]] || die "$tokenizer/tokenizer.json is missing"

# --- the server ---------------------------------------------------------------------------
server_pid=""
stop_server() {
    if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
}
trap stop_server EXIT
trap 'exit 130' INT TERM
if [[ -z $url ]]; then
    [[ -x $KVSCHED ]] || die "no kvsched binary at $KVSCHED (cargo build --release, or set KVSCHED)"
    [[ -f $MODEL ]] || die "no model at $MODEL"
    "$KVSCHED" serve --model "$MODEL" --host 127.0.0.1 --port 0 "${serve_args[@]}" \
        > "$out/server.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 600); do
        url=$(sed -n 's|^kvsched serve: listening on \(http://[^ ]*\).*|\1|p' "$out/server.log" | head -n1)
        [[ -n $url ]] && break
        kill -0 "$server_pid" 2>/dev/null || { cat "$out/server.log" >&2; die "kvsched serve exited"; }
        sleep 0.2
    done
    [[ -n $url ]] || { stop_server; die "kvsched serve printed no listening line in 120 s"; }
    echo "bench-serve: server at $url (log: $out/server.log)" >&2
fi
url=${url%/}

# --- one guidellm run per rate ------------------------------------------------------------
# One process per rate, each with its own seed, so no two rates send the same prompts (with a
# single `rate[0]=..,rate[1]=..` run guidellm replays the same cached prompts at every rate,
# and the server's prefix cache would serve them). Each run costs ~10 s of guidellm start-up.
metrics=kind=generative
[[ -n $slo_ttft ]] && metrics+=,slo.ttft_ms=$slo_ttft
[[ -n $slo_tpot ]] && metrics+=,slo.tpot_ms=$slo_tpot
[[ -n $slo_e2e ]] && metrics+=,slo.e2el_ms=$slo_e2e
i=0
for rate in "${rates[@]}"; do
    case $rate_type in
        constant|poisson)
            profile="kind=$rate_type,rate=$rate"
            n=${requests:-$(python3 -c "import math; print(max(1, math.ceil($rate * $seconds)))")} ;;
        concurrent) profile="kind=concurrent,streams=$rate"; n=${requests:-32} ;;
        synchronous) profile="kind=synchronous"; n=${requests:-32} ;;
    esac
    name=rate-$rate
    echo "bench-serve: $rate_type $rate: $n requests of $prompt_tokens+$output_tokens tokens -> $out/$name.json" >&2
    # --data-loader samples=N: the N prompts are made before the run starts. Without it the
    # loader keeps making prompts (faker + tokenizer) thousands ahead of need and takes
    # ~4x the CPU, which a 2-core machine shares with the server.
    # max_requests: exactly N are sent and all finish. max_duration cancels requests in flight
    # (the report counts them "incomplete"), and combined with max_requests guidellm 0.8.1
    # ends the run while the last request is still in flight and drops it from the report
    # (seen: 39 of 40, 99 of 100, 9 of 10), so it is added only on --max-seconds.
    limit=(--constraint "kind=max_requests,count=$n")
    [[ -n $max_seconds ]] && limit+=(--constraint "kind=max_duration,seconds=$max_seconds")
    "$VENV/bin/guidellm" run \
        --backend "kind=openai_http,target=$url,request_format=$request_format,timeout=$request_timeout" \
        --profile "$profile" \
        "${limit[@]}" \
        --tokenizer "kind=huggingface_auto,model=$tokenizer" \
        --data "kind=synthetic_text,prompt_tokens=$prompt_tokens,output_tokens=$output_tokens" \
        --data-loader "kind=pytorch,samples=$n" \
        --seed "kind=static,value=$((42 + i))" \
        --metrics "$metrics" \
        --output "kind=json,path=$out/$name.json" \
        --label "rate=$rate" \
        --disable-progress > "$out/$name.log" 2>&1 ||
        { tail -n 30 "$out/$name.log" >&2; die "guidellm failed at rate $rate (log: $out/$name.log)"; }
    i=$((i + 1))
done
stop_server

# --- summary: where the numbers are in guidellm 0.8.1's JSON report -----------------------
"$VENV/bin/python" - "$out" "${rates[@]}" <<'PY'
import json, sys
out, rates = sys.argv[1], sys.argv[2:]
rows, reqs = [], []
for rate in rates:
    report = json.load(open(f"{out}/rate-{rate}.json"))
    for b in report["benchmarks"]:
        m = b["metrics"]
        def pct(metric, q, status="successful"):
            d = (m.get(metric) or {}).get(status)
            if not d or not d.get("count"):
                return None
            return d["median"] if q == "p50" else d["percentiles"][q]
        good = m.get("request_goodput")
        rows.append({
            "strategy": b["config"]["strategy"]["type_"], "rate": rate,
            "successful": m["request_totals"]["successful"],
            "errored": m["request_totals"]["errored"],
            "incomplete": m["request_totals"]["incomplete"],
            "duration_s": b["duration"],
            "req_per_s": m["requests_per_second"]["successful"]["mean"],
            "output_tok_per_s": m["output_tokens_per_second"]["total"]["mean"],
            "concurrency_mean": m["request_concurrency"]["total"]["mean"],
            "prompt_tokens_p50": pct("prompt_token_count", "p50"),
            "output_tokens_p50": pct("output_token_count", "p50"),
            **{f"ttft_ms_{q}": pct("time_to_first_token_ms", q) for q in ("p50", "p99")},
            # inter_token_latency_ms = (last - first token) / (n - 1): vLLM's "TPOT"
            **{f"itl_ms_{q}": pct("inter_token_latency_ms", q) for q in ("p50", "p99")},
            # time_per_output_token_ms = (last token - request start) / n: includes TTFT
            **{f"tpot_ms_{q}": pct("time_per_output_token_ms", q) for q in ("p50", "p99")},
            **{f"e2e_s_{q}": pct("request_latency", q) for q in ("p50", "p99")},
            "slo_attainment": m.get("slo_attainment"),
            "goodput_req_per_s": good["total"]["mean"] if good else None,
        })
        for r in b["requests"]["successful"]:
            t = r["info"]["timings"]
            reqs.append([rate, t.get("targeted_start"), r["request_start_time"],
                         r["time_to_first_token_ms"], r["inter_token_latency_ms"],
                         r["request_latency"], r["prompt_tokens"], r["output_tokens"]])
json.dump(rows, open(f"{out}/summary.json", "w"), indent=1)
cols = list(rows[0])
with open(f"{out}/summary.tsv", "w") as f:
    f.write("\t".join(cols) + "\n")
    for row in rows:
        f.write("\t".join("" if row[c] is None else (f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c])) for c in cols) + "\n")
with open(f"{out}/requests.tsv", "w") as f:
    f.write("rate\ttargeted_start\trequest_start\tttft_ms\titl_ms\tlatency_s\tprompt_tokens\toutput_tokens\n")
    for r in reqs:
        f.write("\t".join("" if v is None else str(v) for v in r) + "\n")
show = ["rate", "successful", "errored", "req_per_s", "output_tok_per_s", "ttft_ms_p50", "ttft_ms_p99",
        "itl_ms_p50", "itl_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "slo_attainment", "goodput_req_per_s"]
print("\t".join(show))
for row in rows:
    print("\t".join("-" if row[c] is None else (f"{row[c]:.3g}" if isinstance(row[c], float) else str(row[c])) for c in show))
print(f"bench-serve: reports in {out} (summary.tsv, summary.json, requests.tsv, rate-*.json)", file=sys.stderr)
PY

# --- the simulator on the same requests ---------------------------------------------------
# Each rate's successful requests become an Azure-format trace (arrival = the request's start as
# guidellm sent it, its prompt and output tokens as the server counted them), replayed by
# `kvsched simulate` with the CPU cost model fitted to this engine (--engine cpu-smollm2-135m,
# docs/COST.md) and the server's defaults: 512 KV pages of 16 positions, no host tier, 32
# requests, a 512-token step budget in FCFS chunks of 16. guidellm's prompts are random text, so
# no prefix reuse. With --serve-arg changing any of these, pass the same to the simulator by hand.
[[ ${SIMULATE:-1} == 1 ]] || exit 0
"$VENV/bin/python" - "$out" "$KVSCHED" "$slo_ttft" "$slo_tpot" "${rates[@]}" <<'PY'
import csv, datetime, json, subprocess, sys
out, kvsched, slo_ttft, slo_tpot, rates = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
rows = {r["rate"]: r for r in json.load(open(f"{out}/summary.json"))}
reqs = list(csv.DictReader(open(f"{out}/requests.tsv"), delimiter="\t"))
table = []
for rate in rates:
    mine = sorted((r for r in reqs if r["rate"] == rate), key=lambda r: float(r["request_start"]))
    trace = f"{out}/trace-{rate}.csv"
    with open(trace, "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for r in mine:
            t = datetime.datetime.fromtimestamp(float(r["request_start"]), datetime.timezone.utc)
            f.write(f"{t.strftime('%Y-%m-%d %H:%M:%S.%f')},{r['prompt_tokens']},{r['output_tokens']}\n")
    cmd = [kvsched, "simulate", trace, "--format", "azure", "--adapters", "0", "--engine", "cpu-smollm2-135m",
           "--kv-gpu-pages", "512", "--tokens-per-block", "16", "--kv-host-pages", "0", "--max-batch", "32",
           "--max-tokens", "512", "--chunking", "fcfs", "--chunk-unit", "16", "--no-prefix-reuse",
           "--no-progress", "--json", f"{out}/sim-{rate}.json"]
    if slo_ttft:
        cmd += ["--slo-ttft-ms", slo_ttft]
    if slo_tpot:
        cmd += ["--slo-tpot-ms", slo_tpot]
    subprocess.run(cmd, check=True, stdout=open(f"{out}/sim-{rate}.log", "w"))
    sim = json.load(open(f"{out}/sim-{rate}.json"))
    g = rows[rate]
    table.append([rate, len(mine), g["output_tok_per_s"], sim["throughput_tok_s"],
                  g["ttft_ms_p50"], sim["ttft_ms"]["p50"], g["itl_ms_p50"], sim["tpot_ms"]["p50"],
                  g["goodput_req_per_s"], sim.get("goodput_rps")])
def f(v):
    return "-" if v is None else f"{v:.3g}"
def d(a, b):
    return "-" if a is None or b is None else f"{(b / a - 1) * 100:+.1f} %"
lines = ["| rate (req/s) | requests | output tok/s server / sim | TTFT p50 ms server / sim | ITL (TPOT) p50 ms server / sim | goodput req/s server / sim |",
         "|---|---|---|---|---|---|"]
for rate, n, gt, st, gf, sf, gi, si, gg, sg in table:
    lines.append(f"| {rate} | {n} | {f(gt)} / {f(st)} | {f(gf)} / {f(sf)} ({d(gf, sf)}) | {f(gi)} / {f(si)} ({d(gi, si)}) | {f(gg)} / {f(sg)} |")
open(f"{out}/versus-simulator.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
