"""Dynamo's KvRouter over two `kvsched serve` replicas (server/tests/dynamo_router.rs).

argv: replica A's and B's KV event endpoints and HTTP URLs, then the prompt's token ids (comma-separated).
Two Dynamo workers (one runtime each, file discovery in $DYN_FILE_KV, the event plane on ZMQ) stand for
the replicas: each serves a placeholder endpoint, registers the model, and relays its replica's KV events
(`KvEventPublisher(zmq_endpoint=...)`). A third runtime's `KvRouter` asks `best_worker` for the prompt and a
continuation of it after replica A served the prompt: A's worker, with the prompt's full blocks matched. The
continuation then sent to A is a prefix hit in A's `/metrics` (`vllm:prefix_cache_hits_total`).
Prints a JSON summary, then "ok".
"""

import asyncio
import json
import os
import re
import sys
import urllib.request

from dynamo._core import (DistributedRuntime, KvEventPublisher, KvRouter, KvRouterConfig, ModelInput,
                          ModelType, WorkerType, register_model)

events = sys.argv[1:3]
urls = sys.argv[3:5]
prompt = [int(t) for t in sys.argv[5].split(",")]
BLOCK = 16


def post(url, body):
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200, r.status


def hits(url):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)$", text, re.M)
    return float(m.group(1))


async def handler(request, context=None):
    yield {"token_ids": [], "finish_reason": "stop"}


async def main():
    loop = asyncio.get_running_loop()
    workers, keep = [], []
    for at in events:
        rt = DistributedRuntime(loop, "file", "tcp", event_plane="zmq")
        ep = rt.endpoint("kvsched.replica.generate")
        await register_model(ModelInput.Tokens, ModelType.Completions, ep, "kvsched", "kvsched",
                             worker_type=WorkerType.Aggregated, kv_cache_block_size=BLOCK,
                             skip_model_assets=True)
        keep.append(asyncio.ensure_future(ep.serve_endpoint(handler)))
        await asyncio.sleep(0.5)
        keep.append(KvEventPublisher(ep, kv_block_size=BLOCK, zmq_endpoint=at))
        keep.append(rt)
        workers.append(ep.connection_id())
    rt = DistributedRuntime(loop, "file", "tcp", event_plane="zmq")
    router = KvRouter(rt.endpoint("kvsched.replica.generate"), BLOCK, KvRouterConfig())
    await asyncio.sleep(1.5)  # the router finds both workers; the relays subscribe

    post(urls[0], {"model": "smollm2", "prompt": prompt, "max_tokens": 2, "temperature": 0})
    continuation = prompt + [7, 8, 9]
    full = len(prompt) // BLOCK
    best = None
    for _ in range(100):
        best = await router.best_worker(continuation)
        if best[0] == workers[0] and best[2] == full:
            break
        await asyncio.sleep(0.1)
    assert best[0] == workers[0] and best[2] == full, (best, workers)

    before = hits(urls[0])
    post(urls[0], {"model": "smollm2", "prompt": continuation, "max_tokens": 2, "temperature": 0})
    after = hits(urls[0])
    assert after - before >= full * BLOCK, (before, after)
    print(json.dumps({"workers": workers, "best": list(best), "hit_tokens": after - before}))
    print("ok", flush=True)
    os._exit(0)  # the runtimes' background tasks would keep the interpreter


asyncio.run(main())
