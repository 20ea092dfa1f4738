"""The official `openai` client against `kvsched serve --max-num-seqs 2 --class-share 0:requests=1` with a
host tier.

Run by server/tests/openai_client.rs with KVSCHED_URL and KVSCHED_BASE. Two streams of service class 1
(kvsched's `service_class`, through `extra_body`) fill the batch; a class-0 request arrives while they
stream: class 0 is within its share of one batch slot, so a class-1 stream yields (suspended to the host
tier, then resumed), the class-0 request ends first, and both streams end with the very text they have
alone (greedy). A class past the last is refused (400). /metrics counts the latencies of each class.
Prints one line per check, then "N checks passed".
"""

import os
import sys
import threading
import time
import urllib.request

import openai

URL = os.environ["KVSCHED_URL"]
BASE = os.environ["KVSCHED_BASE"]
client = openai.OpenAI(base_url=URL + "/v1", api_key="unused", max_retries=0, timeout=300)
LOW = dict(model=BASE, prompt="The history of the river town begins", max_tokens=48, temperature=0)
HIGH = dict(model=BASE, prompt="Name a colour:", max_tokens=6, temperature=0)
checks = []


def stream_low(out):
    text = ""
    for chunk in client.completions.create(stream=True, extra_body={"service_class": 1}, **LOW):
        for c in chunk.choices:
            text += c.text
            out.setdefault("first", time.monotonic())
    out["text"], out["end"] = text, time.monotonic()


alone = client.completions.create(extra_body={"service_class": 1}, **LOW).choices[0].text
assert alone, alone

outs = [{}, {}]
threads = [threading.Thread(target=stream_low, args=(o,)) for o in outs]
for t in threads:
    t.start()
while not all("first" in o for o in outs) and all(t.is_alive() for t in threads):
    time.sleep(0.005)
r = client.completions.create(extra_body={"service_class": 0}, **HIGH)
high_end = time.monotonic()
for t in threads:
    t.join()
assert r.choices[0].text, r
assert all(high_end < o["end"] for o in outs), "the class-0 request waited for the class-1 streams"
assert all(o["text"] == alone for o in outs), ([o["text"] for o in outs], alone)
checks.append("a class within its share takes a batch slot back; the streams end with their own text")
print("ok:", checks[-1], flush=True)

try:
    client.completions.create(extra_body={"service_class": 4}, **HIGH)
    raise AssertionError("service_class 4 was accepted")
except openai.BadRequestError as e:
    assert "service_class" in str(e), e
checks.append("a class past the last is refused")
print("ok:", checks[-1], flush=True)

metrics = urllib.request.urlopen(URL + "/metrics", timeout=30).read().decode()
for c in (0, 1):
    series = f'kvsched:class_time_to_first_token_seconds_count{{model_name="{BASE}",service_class="{c}",priority="0"}}'
    line = next((l for l in metrics.splitlines() if l.startswith(series)), None)
    assert line and int(line.split()[-1]) >= 1, (series, metrics[-3000:])
checks.append("/metrics counts each class's time to first token")
print("ok:", checks[-1], flush=True)

print(f"{len(checks)} checks passed")
sys.exit(0)
