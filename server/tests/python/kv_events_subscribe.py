"""A KV-aware router's view of `kvsched serve --kv-events` (server/tests/kv_events_publish.rs).

argv: the vLLM wheel, the PUB endpoint, the replay endpoint, the server's URL, the base model's name,
an adapter's name, a prompt, the folder of an adapter to load at run time. Subscribes (pyzmq SUB),
loads that adapter as "loaded" (/v1/load_lora_adapter), sends the prompt to the base model, to the
adapter given at start and to the loaded one (/v1/completions), and reads the published batches: each is `[topic, seq, payload]` with
sequence numbers 0, 1, 2, ...; vLLM's own `KVEventBatch` decoder reads every payload, which msgspec
re-encodes to the same bytes. Then asks the replay socket (DEALER) for every batch from 0 and
requires the same payloads, then the end marker. Prints a JSON summary, then "ok".
"""

import json
import sys
import time
import urllib.request

import msgspec
import zmq

from vllm_kv import load

wheel, endpoint, replay, url, base, adapter, prompt, loaded_dir = sys.argv[1:9]
LOADED = "loaded"
kv = load(wheel)
decoder = msgspec.msgpack.Decoder(kv.KVEventBatch)
encoder = msgspec.msgpack.Encoder()
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, b"")
sub.connect(endpoint)
time.sleep(0.5)  # the subscription reaches the publisher before anything is published


def post(path, fields):
    body = json.dumps(fields).encode()
    req = urllib.request.Request(url + path, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200, r.status


def complete(model):
    post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0})


post("/v1/load_lora_adapter", {"lora_name": LOADED, "lora_path": loaded_dir})
complete(base)
complete(adapter)
complete(LOADED)
wanted = {None, adapter, LOADED}

published, stores = [], []
deadline = time.time() + 20
while time.time() < deadline and len({s["lora_name"] for s in stores}) < len(wanted):
    if not sub.poll(200):
        continue
    topic, seq, payload = sub.recv_multipart()
    assert topic == b"", topic
    assert int.from_bytes(seq, "big") == len(published), (seq, len(published))
    batch = decoder.decode(payload)
    assert encoder.encode(batch) == payload, "msgspec re-encodes the same bytes"
    assert batch.data_parallel_rank == 0
    published.append(payload)
    for e in batch.events:
        if isinstance(e, kv.BlockStored):
            assert e.block_size == 16 and len(e.token_ids) == 16 * len(e.block_hashes), e
            assert e.medium == "GPU", e
            stores.append({"hashes": list(e.block_hashes), "parent": e.parent_block_hash,
                           "lora_name": e.lora_name, "tokens": len(e.token_ids)})

names = {s["lora_name"] for s in stores}
assert names == wanted, f"a loaded adapter's blocks carry its name too: {stores}"
for name in names:
    mine = [s for s in stores if s["lora_name"] == name]
    assert mine[0]["parent"] is None, f"{name}: a prompt's first block has no parent"
base_hashes = {h for s in stores if s["lora_name"] is None for h in s["hashes"]}
for name in (adapter, LOADED):
    mine = {h for s in stores if s["lora_name"] == name for h in s["hashes"]}
    assert not base_hashes & mine, f"{name}: an adapter's blocks are keyed apart from the base model's"

dealer = ctx.socket(zmq.DEALER)
dealer.connect(replay)
dealer.send_multipart([b"", (0).to_bytes(8, "big")])
replayed = []
while True:
    assert dealer.poll(5000), "the replay answers"
    _, seq, payload = dealer.recv_multipart()
    if int.from_bytes(seq, "big", signed=True) == -1:
        assert payload == b""
        break
    assert int.from_bytes(seq, "big") == len(replayed)
    replayed.append(payload)
assert replayed[: len(published)] == published, "the replay sends the published batches"

print(json.dumps({"batches": len(published), "replayed": len(replayed), "stores": stores}))
print("ok")
