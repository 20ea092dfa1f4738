"""The official `openai` client against `kvsched serve --scheduling-policy priority --max-num-seqs 1`.

Run by server/tests/openai_client.rs with KVSCHED_URL and KVSCHED_BASE. A low-priority stream (vLLM's
`priority` 10, through `extra_body`) runs alone; a request of priority -5 arrives while it streams: the
scheduler makes the stream yield (its KV given up and recomputed later), the high-priority request ends
first, and the stream then ends with the very text it has when it runs alone (greedy). A request of equal
priority does not overtake it. Prints one line per check, then "N checks passed".
"""

import os
import sys
import threading
import time

import openai

URL = os.environ["KVSCHED_URL"]
BASE = os.environ["KVSCHED_BASE"]
client = openai.OpenAI(base_url=URL + "/v1", api_key="unused", max_retries=0, timeout=300)
LOW = dict(model=BASE, prompt="The history of the river town begins", max_tokens=48, temperature=0)
HIGH = dict(model=BASE, prompt="Name a colour:", max_tokens=6, temperature=0)
checks = []


def stream_low(priority, out):
    text = ""
    for chunk in client.completions.create(stream=True, extra_body={"priority": priority}, **LOW):
        for c in chunk.choices:
            text += c.text
            out.setdefault("first", time.monotonic())
    out["text"], out["end"] = text, time.monotonic()


def race(low, high):
    """The low stream, then `high` once it streams: (low's text, whether high ended first)."""
    out = {}
    t = threading.Thread(target=stream_low, args=(low, out))
    t.start()
    while "first" not in out and t.is_alive():
        time.sleep(0.005)
    r = client.completions.create(extra_body={"priority": high}, **HIGH)
    high_end = time.monotonic()
    t.join()
    assert r.choices[0].text, r
    return out["text"], high_end < out["end"]


alone = client.completions.create(extra_body={"priority": 10}, **LOW).choices[0].text
assert alone, alone

text, first = race(10, -5)
assert first, "the priority -5 request ended after the stream it should have overtaken"
assert text == alone, (text, alone)
checks.append("a higher priority overtakes a running stream, which ends with its own text")
print("ok:", checks[-1], flush=True)

text, first = race(10, 10)
assert not first, "an equal priority overtook the running stream"
assert text == alone, (text, alone)
checks.append("an equal priority waits its turn")
print("ok:", checks[-1], flush=True)

print(f"{len(checks)} checks passed")
sys.exit(0)
