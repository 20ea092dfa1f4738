"""Replays a shipped trace slice through the kvsched Python module, one engine iteration per pass, and
measures what one `schedule()` call costs from Python.

    python examples/python/replay.py [data/azure_conv_head.csv] [--requests N]

Arrivals are admitted in trace order as the engine's table has room (no clock: this is the scheduler's
loop, not the simulator; `kvsched simulate` models time). Then the S1-256 shape of the benchmarks
(256 requests decoding, every pass the same) is timed: 2,000 `schedule()` calls, each building its lists as
Python objects, and the same with the batch's ids read.
"""

import argparse
import csv
import time
from pathlib import Path

import kvsched

ROOT = Path(__file__).resolve().parents[2]


def replay(path, limit):
    rows = list(csv.DictReader(open(path, newline="")))[:limit]
    s = kvsched.Scheduler(tokens_per_block=32, gpu_pages=8192, host_pages=0, max_blocks_per_request=512,
                          max_requests=256, max_batch=256, max_num_tokens=8192, chunk_unit=512)
    pending = [(i, int(r["ContextTokens"]), max(1, int(r["GeneratedTokens"]))) for i, r in enumerate(rows)]
    pending.reverse()
    want, produced = {}, {}
    passes = prompt_tokens = decode_steps = 0
    while pending or len(s):
        while pending and len(s) < 256:
            i, prompt, out = pending.pop()
            s.submit(i, prompt, max_new_tokens=out)
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
    print(f"replayed {len(rows)} requests of {Path(path).name} in {passes} passes: "
          f"{prompt_tokens} prompt tokens, {decode_steps} decode steps")


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


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", nargs="?", default=str(ROOT / "data" / "azure_conv_head.csv"))
    ap.add_argument("--requests", type=int, default=1500)
    a = ap.parse_args()
    replay(a.trace, a.requests)
    schedule_cost()
