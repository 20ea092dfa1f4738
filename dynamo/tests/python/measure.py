"""The measurements in docs/DYNAMO.md (run by hand; the commands are there). Every server on 127.0.0.1.

overhead WORKER KVSCHED MODEL WORK
    Dynamo's frontend over one `kvsched-dynamo` worker against `kvsched serve` direct, on the same 24
    streamed chats (greedy, 32 tokens, EOS ignored), sent one at a time, each pair in alternating order:
    TTFT and ITL p50 on each path and of the paired differences.
hitrate WORKER MODEL WORK
    A multi-turn workload written as a Mooncake trace (WORK/multiturn.jsonl: 8 conversations of 3 turns,
    prompts of 512-token blocks, each turn its previous prompt plus one new block; two system blocks shared
    by four conversations each; each round's turns in a seeded random order) sent as token ids through the frontend over two workers, with
    `--router-mode kv` and then `round-robin`: the prefix cache hit rate over both workers' /metrics.
    `kvsched simulate WORK/multiturn.jsonl --replicas 2 --route kv` replays the same trace.
"""

import json
import os
import random
import statistics
import subprocess
import sys
import time

from openai import OpenAI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stack import NAME, Stack, free_port, get, wait_for  # noqa: E402

TOPICS = ["a lighthouse", "a lost key", "the first snow", "a quiet train", "an old map", "a red kite",
          "a bakery at dawn", "a river crossing", "a broken clock", "a garden wall", "a night market",
          "a paper boat", "a mountain hut", "a violin", "a stray cat", "a desert road", "a library",
          "a storm at sea", "a bicycle", "a glass of water", "a letter", "a staircase", "a fox", "a bridge"]


def timed(client, topic):
    """One streamed chat: (TTFT, the gaps between its later tokens, its prompt's tokens), seconds."""
    began = time.perf_counter()
    stamps, prompt = [], None
    stream = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": f"Write a short story about {topic}."}],
        max_tokens=32, temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.perf_counter())
        if chunk.usage:
            prompt = chunk.usage.prompt_tokens
    return stamps[0] - began, [b - a for a, b in zip(stamps, stamps[1:])], prompt


def serve(kvsched, model, work):
    port = free_port()
    log = open(os.path.join(work, "serve.log"), "w")
    proc = subprocess.Popen([kvsched, "serve", "--model", model, "--served-model-name", NAME,
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_for("kvsched serve", lambda: get(url + "/health")[0] == 200, proc=proc)
    return proc, url


def overhead(worker, kvsched, model, work):
    proc, url = serve(kvsched, model, work)
    try:
        with Stack(worker, model, work, router_mode="round-robin", workers=1) as stack:
            paths = {"frontend": OpenAI(base_url=stack.url + "/v1", api_key="none", max_retries=0),
                     "direct": OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)}
            timed(paths["frontend"], "warming up")
            timed(paths["direct"], "warming up")
            runs = {k: [] for k in paths}
            for i, topic in enumerate(TOPICS):
                for k in (["frontend", "direct"] if i % 2 == 0 else ["direct", "frontend"]):
                    runs[k].append(timed(paths[k], topic))
    finally:
        proc.terminate()
        proc.wait()
    ms = lambda v: round(v * 1000, 2)  # noqa: E731
    out = {}
    for k, rs in runs.items():
        out[k] = {"ttft_p50_ms": ms(statistics.median(r[0] for r in rs)),
                  "itl_p50_ms": ms(statistics.median(g for r in rs for g in r[1]))}
    pairs = list(zip(runs["frontend"], runs["direct"]))
    out["same_prompt_tokens"] = all(f[2] == d[2] for f, d in pairs)
    out["paired_ttft_p50_ms"] = ms(statistics.median(f[0] - d[0] for f, d in pairs))
    out["paired_itl_p50_ms"] = ms(statistics.median(
        statistics.median(f[1]) - statistics.median(d[1]) for f, d in pairs))
    print(json.dumps(out, indent=1))


def trace(path, vocab_floor=200, vocab=49000):
    """The multi-turn trace (Mooncake JSONL) and each request's token ids."""
    rng = random.Random(7)
    blocks = {}

    def block(h):
        if h not in blocks:
            blocks[h] = [rng.randrange(vocab_floor, vocab) for _ in range(512)]
        return blocks[h]

    rows, prompts, next_id = [], [], 2
    convs = [[c % 2] for c in range(8)]
    for turn in range(3):
        order = list(range(len(convs)))
        rng.shuffle(order)  # the turns of a round in no fixed order: round robin is not sticky by accident
        for c in order:
            ids = convs[c]
            ids.append(next_id)
            next_id += 1
            rows.append({"timestamp": len(rows) * 20000, "input_length": 512 * len(ids),
                         "output_length": 16, "hash_ids": list(ids)})
            prompts.append([t for h in ids for t in block(h)])
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return prompts


def hitrate(worker, model, work):
    prompts = trace(os.path.join(work, "multiturn.jsonl"))
    out = {}
    for mode in ["kv", "round-robin"]:
        with Stack(worker, model, os.path.join(work, mode), router_mode=mode,
                   worker_args=["--max-model-len", "4096"]) as stack:
            client = OpenAI(base_url=stack.url + "/v1", api_key="none", timeout=300, max_retries=0)
            before = stack.counters()
            for p in prompts:
                client.completions.create(model=NAME, prompt=p, max_tokens=16, temperature=0,
                                          extra_body={"ignore_eos": True})
                time.sleep(0.5)  # its KV events reach the router
            after = stack.counters()
        q = sum(after[i]["queries"] - before[i]["queries"] for i in after)
        h = sum(after[i]["hits"] - before[i]["hits"] for i in after)
        out[mode] = {"queried_tokens": q, "hit_tokens": h, "hit_rate": round(h / q, 4),
                     "queried_by_worker": [after[i]["queries"] - before[i]["queries"] for i in after]}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    {"overhead": overhead, "hitrate": hitrate}[sys.argv[1]](*sys.argv[2:])
