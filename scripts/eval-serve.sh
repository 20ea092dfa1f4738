#!/usr/bin/env bash
# An independent check that the served model's outputs are sane: lm-evaluation-harness
# (lm_eval[api], pinned, in ${CARGO_TARGET_DIR:-target}/lmeval-venv; no torch needed for API models)
# runs the small generate_until task scripts/lm-eval/kvsched_sanity.yaml (30 questions written for
# this project) through `kvsched serve`'s /v1/chat/completions (the model's chat template), greedy,
# one request at a time.
#
#   scripts/eval-serve.sh [--url URL] [--model GGUF] [--adapter NAME=PATH]
#
# Without --url it starts `kvsched serve --port 0` (target/release/kvsched, or $KVSCHED) on the
# test model and stops it at the end. The built-in lm-eval tasks load their data from the Hugging
# Face hub, which this machine cannot reach; this task's data is in the repository.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
case $TARGET in /*) ;; *) TARGET=$ROOT/$TARGET ;; esac
VENV=$TARGET/lmeval-venv
LM_EVAL_VERSION=0.4.13
KVSCHED=${KVSCHED:-$TARGET/release/kvsched}
url="" model=${KVSCHED_MODEL:-} serve_args=() name=""
while (($#)); do
    case $1 in
        --url) url=$2; shift 2 ;;
        --model) model=$2; shift 2 ;;
        --adapter) serve_args+=(--adapter "$2"); name=${2%%=*}; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "eval-serve: unknown argument $1" >&2; exit 2 ;;
    esac
done
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('lm_eval') != '$LM_EVAL_VERSION')" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "lm_eval[api]==$LM_EVAL_VERSION"
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
out=$TARGET/eval-serve
mkdir -p "$out"
pid=""
trap '[[ -n $pid ]] && kill -TERM $pid 2>/dev/null; wait 2>/dev/null || true' EXIT
if [[ -z $url ]]; then
    [[ -n $model ]] || model=$("$ROOT/scripts/fetch-model.sh")
    "$KVSCHED" serve --model "$model" --port 0 --served-model-name sanity "${serve_args[@]}" > "$out/server.log" 2>&1 &
    pid=$!
    for _ in $(seq 300); do
        url=$(sed -n 's|^kvsched serve: listening on \(http://[^ ]*\).*|\1|p' "$out/server.log" | head -n1)
        [[ -n $url ]] && break
        kill -0 $pid 2>/dev/null || { cat "$out/server.log" >&2; exit 1; }
        sleep 0.2
    done
    [[ -n $url ]] || { echo "eval-serve: the server printed no ready line" >&2; exit 1; }
fi
served=${name:-$(curl -s "$url/v1/models" | "$VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')}
cd "$ROOT"
"$VENV/bin/lm_eval" --model local-chat-completions --apply_chat_template \
    --model_args "model=$served,base_url=$url/v1/chat/completions,tokenizer_backend=none,tokenized_requests=False,num_concurrent=1,max_retries=1" \
    --include_path scripts/lm-eval --tasks kvsched_sanity --output_path "$out" --log_samples 2>&1 |
    tee "$out/lm-eval.log" | grep -E '^\|' || true
grep -q 'kvsched_sanity' "$out/lm-eval.log" || { tail -n 30 "$out/lm-eval.log" >&2; exit 1; }
