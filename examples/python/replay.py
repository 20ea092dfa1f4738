"""Replays a shipped trace slice through the kvsched Python module, one engine iteration per pass, and
measures what one `schedule()` call costs from Python.

    python examples/python/replay.py [TRACE] [--requests N] [--no-timing]

TRACE is one of the shipped formats (data/README.md), told apart by their columns: Azure's LLM inference
CSV (ContextTokens, GeneratedTokens: data/azure_conv_head.csv, the default, and azure_code_head.csv),
BurstGPT's CSV (Request tokens, Response tokens: data/burstgpt1_head54.csv; its rows with an empty prompt
are skipped) and Mooncake's JSON lines (input_length, output_length, hash_ids:
data/mooncake_*_head.jsonl; each 512-token hash_id becomes the block hashes of its 32-token pages, so
requests that share a prefix reuse its cached pages). Anything else is refused with a message.

Arrivals are admitted in trace order as the engine's table has room (no clock: this is the scheduler's
loop, not the simulator; `kvsched simulate` models time). Then the S1-256 shape of the benchmarks
(256 requests decoding, every pass the same) is timed: 2,000 `schedule()` calls, each building its lists as
Python objects, and the same with the batch's ids read.
"""

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import kvsched

ROOT = Path(__file__).resolve().parents[2]
TOKENS_PER_BLOCK = 32
#: Mooncake's hash_ids name 512-token blocks.
MOONCAKE_BLOCK = 512
FORMATS = ("Azure CSV (ContextTokens, GeneratedTokens), BurstGPT CSV (Request tokens, Response tokens) "
           "or Mooncake JSON lines (input_length, output_length, hash_ids)")


class TraceError(Exception):
    """A trace this example cannot read."""


def mooncake_hashes(hash_ids, prompt):
    """One hash a full 32-token page: page k of 512-token block b gets a hash derived from b and k."""
    per = MOONCAKE_BLOCK // TOKENS_PER_BLOCK
    return [hash_ids[k // per] * per + k % per for k in range(prompt // TOKENS_PER_BLOCK)]


def read_trace(path, limit):
    """The first `limit` requests of a shipped trace as (prompt, output, hashes), and how many rows were
    skipped; TraceError for a file of another format."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    requests, skipped = [], 0
    if path.suffix == ".jsonl":
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if len(requests) == limit:
                    break
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                    prompt, out = int(r["input_length"]), int(r["output_length"])
                    hashes = mooncake_hashes([int(h) for h in r["hash_ids"]], prompt)
                except (ValueError, KeyError, TypeError, IndexError) as e:
                    raise TraceError(f"{path}, line {n}: not a Mooncake record ({e!r}); "
                                     f"the formats read: {FORMATS}") from None
                requests.append((prompt, max(1, out), hashes))
        return requests, skipped
    with open(path, newline="") as f:
        rows = csv.DictReader(f)
        columns = set(rows.fieldnames or [])
        if {"ContextTokens", "GeneratedTokens"} <= columns:
            prompt_col, out_col = "ContextTokens", "GeneratedTokens"
        elif {"Request tokens", "Response tokens"} <= columns:
            prompt_col, out_col = "Request tokens", "Response tokens"
        else:
            raise TraceError(f"{path}: columns {sorted(columns)} are none of the formats read: {FORMATS}")
        for n, r in enumerate(rows, 2):
            if len(requests) == limit:
                break
            try:
                prompt, out = int(r[prompt_col]), int(r[out_col])
            except (ValueError, TypeError) as e:
                raise TraceError(f"{path}, line {n}: {e}") from None
            if prompt == 0:
                skipped += 1
                continue
            requests.append((prompt, max(1, out), []))
    return requests, skipped


def replay(path, limit):
    rows, skipped = read_trace(path, limit)
    # Room for Mooncake's longest prompts (135k tokens): 8,192 pages a request.
    s = kvsched.Scheduler(tokens_per_block=TOKENS_PER_BLOCK, gpu_pages=16384, host_pages=0,
                          max_blocks_per_request=8192, max_requests=256, max_batch=256,
                          max_num_tokens=8192, chunk_unit=512)
    pending = [(i, prompt, out, hashes) for i, (prompt, out, hashes) in enumerate(rows)]
    pending.reverse()
    want, produced = {}, {}
    passes = prompt_tokens = decode_steps = 0
    while pending or len(s):
        while pending and len(s) < 256:
            i, prompt, out, hashes = pending.pop()
            s.submit(i, prompt, max_new_tokens=out, hashes=hashes)
            want[i] = out
        out = s.schedule()
        s.ensure_batch()
        s.take_moves()
        for e in out.context:
            prompt_tokens += e.tokens
            if e.last:
                produced[e.id] = produced.get(e.id, 0) + 1
        for e in out.generation:
            produced[e.id] = produced.get(e.id, 0) + 1
            decode_steps += 1
        for e in out.recompute_paused:
            produced[e.id] = 0
        s.complete_step()
        for e in list(out.context) + list(out.generation):
            if produced.get(e.id, 0) >= want[e.id]:
                s.finish(e.id)
        passes += 1
    note = f" ({skipped} rows with an empty prompt skipped)" if skipped else ""
    print(f"replayed {len(rows)} requests of {Path(path).name} in {passes} passes: "
          f"{prompt_tokens} prompt tokens, {decode_steps} decode steps{note}")


def schedule_cost():
    """S1-256: 256 decoding requests; every pass schedules all of them."""
    s = kvsched.Scheduler(tokens_per_block=32, gpu_pages=65536, host_pages=0, max_blocks_per_request=64,
                          max_requests=256, max_batch=256, max_num_tokens=8192, chunk_unit=0,
                          prefix_cache=False)
    for i in range(256):
        s.submit(i, 16, max_new_tokens=1_000)
    while True:  # prefill everything first
        out = s.schedule()
        s.complete_step()
        if len(out.generation) == 256:
            break
    call, read = [], []
    for _ in range(2000):
        t0 = time.perf_counter_ns()
        out = s.schedule()
        t1 = time.perf_counter_ns()
        ids = [e.id for e in out.generation]  # the batch read, as an engine reads it
        t2 = time.perf_counter_ns()
        call.append(t1 - t0)
        read.append(t2 - t0)
        assert len(ids) == 256
        s.complete_step()

    def us(v, q):
        return sorted(v)[int(len(v) * q)] / 1000

    print(f"schedule() from Python, S1-256 (its 256 entries built as Python objects): median "
          f"{us(call, 0.5):.1f} us, p99 {us(call, 0.99):.1f} us; with the ids read: median "
          f"{us(read, 0.5):.1f} us, p99 {us(read, 0.99):.1f} us (the reference's Python pass: 410.9 us)")


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Replay a shipped trace slice through the kvsched Python module (one engine "
                    "iteration a pass), then time schedule() from Python on the S1-256 shape.")
    ap.add_argument("trace", nargs="?", default=str(ROOT / "data" / "azure_conv_head.csv"),
                    help=f"the trace to replay: {FORMATS} (default: data/azure_conv_head.csv)")
    ap.add_argument("--requests", type=int, default=1500, metavar="N",
                    help="replay the trace's first N requests (default: 1500)")
    ap.add_argument("--no-timing", action="store_true",
                    help="replay only; skip the schedule() timing")
    a = ap.parse_args(argv)
    try:
        replay(a.trace, a.requests)
    except TraceError as e:
        sys.exit(f"replay.py: {e}")
    if not a.no_timing:
        schedule_cost()


if __name__ == "__main__":
    main()
