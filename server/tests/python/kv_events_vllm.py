"""vLLM's own KV event structs against kvsched's bytes (server/tests/kv_events_vllm.rs).

Loads `vllm/distributed/kv_events.py` from the pinned vLLM wheel (argv[1]) as a module, with the few
vLLM modules it imports stubbed (no vLLM code is in the repository), then, for every hex-encoded batch
of argv[2]: decodes it with vLLM's `KVEventBatch` decoder, encodes the decoded batch again with
msgspec's encoder, and requires the same bytes; then builds the batch anew from vLLM's own classes
and requires the same bytes again. Prints each batch as JSON (one line), then "N batches alike".
"""

import json
import sys

import msgspec

from vllm_kv import load


def rebuild(kv, batch):
    events = []
    for e in batch.events:
        if isinstance(e, kv.BlockStored):
            events.append(kv.BlockStored(
                block_hashes=list(e.block_hashes), parent_block_hash=e.parent_block_hash,
                token_ids=list(e.token_ids), block_size=e.block_size, lora_id=e.lora_id,
                medium=e.medium, lora_name=e.lora_name))
        elif isinstance(e, kv.BlockRemoved):
            events.append(kv.BlockRemoved(block_hashes=list(e.block_hashes), medium=e.medium))
        else:
            events.append(kv.AllBlocksCleared())
    return kv.KVEventBatch(ts=batch.ts, events=events, data_parallel_rank=batch.data_parallel_rank)


def main():
    kv = load(sys.argv[1])
    decoder = msgspec.msgpack.Decoder(kv.KVEventBatch)
    encoder = msgspec.msgpack.Encoder()
    n = 0
    for line in open(sys.argv[2]):
        ours = bytes.fromhex(line.strip())
        batch = decoder.decode(ours)
        again = encoder.encode(batch)
        assert again == ours, f"batch {n}: msgspec re-encodes {again.hex()}, kvsched wrote {ours.hex()}"
        anew = encoder.encode(rebuild(kv, batch))
        assert anew == ours, f"batch {n}: vLLM's structs encode {anew.hex()}"
        print(json.dumps({
            "ts": batch.ts,
            "rank": batch.data_parallel_rank,
            "events": [{"type": type(e).__name__, **{f: getattr(e, f) for f in e.__struct_fields__
                                                     if f in ("block_hashes", "parent_block_hash", "token_ids", "block_size",
                                                              "lora_id", "medium", "lora_name")}}
                       for e in batch.events],
        }))
        n += 1
    print(f"{n} batches alike")


main()
