"""Dynamo's frontend (`--router-mode kv`) over two `kvsched-dynamo` workers (dynamo/tests/frontend.rs runs
this inside a loopback-only network namespace: `unshare -n`).

argv: the worker binary, the GGUF model, a work folder of the test's.
Every process binds and advertises 127.0.0.1 (Dynamo 1.6.1 binds its ZMQ event sockets on 0.0.0.0: the
namespace has no other interface). Discovery is a folder (DYN_FILE_KV), the request plane TCP, the event
plane ZMQ: no etcd, no NATS.

Checks, through the official `openai` client: chats whole and streamed, a completion; requests sharing a
long prefix land on the worker that served it first (its `/metrics`: the prefix cache queries rise there
only, the hits by the prefix's blocks); an unrelated request is served; a client that disconnects cancels
its request on the worker; SIGTERM to the holder drains it (its stream runs to the end, it exits 0) while
the other keeps serving. Prints a JSON summary, then "ok".
"""

import json
import os
import sys
import time

from openai import OpenAI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stack import NAME, Stack  # noqa: E402

WORKER, MODEL, WORK = sys.argv[1:4]

# A long shared prefix: 40 numbered facts (about 600 tokens, 37 full blocks of 16).
PREFIX = "You answer questions about this list of facts.\n" + "".join(
    f"Fact {i}: the {c} box holds {i * 7} marbles and sits on shelf {i % 5}.\n"
    for i, c in enumerate(["red", "blue", "green", "amber", "violet"] * 8))


def chat(client, system, user, **kw):
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return client.chat.completions.create(model=NAME, messages=messages, temperature=0, **kw)


def whole_and_streamed(client):
    r = chat(client, None, "Name three colours.", max_tokens=24)
    c = r.choices[0]
    assert c.message.content and c.finish_reason in ("stop", "length"), r
    assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0, r.usage
    parts, finish = [], None
    for chunk in chat(client, None, "Name three colours.", max_tokens=24, stream=True):
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert "".join(parts) == c.message.content, (parts, c.message.content)
    assert finish == c.finish_reason, (finish, c.finish_reason)
    comp = client.completions.create(model=NAME, prompt="The capital of France is", max_tokens=8,
                                     temperature=0)
    assert comp.choices[0].text and comp.usage.completion_tokens > 0, comp
    return {"chat": c.message.content, "completion": comp.choices[0].text}


def route_to_holder(client, stack):
    before = stack.counters()
    chat(client, PREFIX, "Which shelf holds the red box?", max_tokens=8)
    served = stack.served_since(before)
    assert len(served) == 1, served
    holder = served[0]
    time.sleep(1.0)  # the holder's KV events reach the router
    hits = []
    for q in ["How many marbles are in the blue box?", "Which box is on shelf 3?",
              "Name a violet box.", "Count the green boxes."]:
        before = stack.counters()
        chat(client, PREFIX, q, max_tokens=8)
        served = stack.served_since(before)
        assert served == [holder], (q, served, holder)
        gained = stack.counters()[holder]["hits"] - before[holder]["hits"]
        assert gained >= 30 * 16, (q, gained)
        hits.append(gained)
    before = stack.counters()
    chat(client, None, "Write one sentence about the sea.", max_tokens=8)
    unrelated = stack.served_since(before)
    assert len(unrelated) == 1, unrelated
    return holder, {"holder": holder, "prefix_hits": hits, "unrelated_served_by": unrelated[0]}


def disconnect_cancels(client, stack):
    before = stack.counters()
    stream = chat(client, None, "Count from one to one thousand in words.", max_tokens=1500, stream=True,
                  extra_body={"ignore_eos": True})
    seen = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            seen += 1
            if seen == 3:
                break
    stream.response.close()
    deadline = time.time() + 20
    while time.time() < deadline:
        now = stack.counters()
        cancelled = sum(now[i]["cancelled"] - before[i]["cancelled"] for i in range(2))
        running = sum(now[i]["running"] for i in range(2))
        if cancelled == 1 and running == 0:
            return {"cancelled_after_chunks": seen}
        time.sleep(0.1)
    raise AssertionError(f"the disconnect did not cancel: {stack.counters()}")


def sigterm_drains(client, stack, holder):
    other = 1 - holder
    stream = chat(client, PREFIX, "List every fact again.", max_tokens=200, stream=True,
                  extra_body={"ignore_eos": True})
    it = iter(stream)
    first = next(it)
    stack.workers[holder].terminate()
    pieces, finish = 1, None
    for chunk in it:
        if chunk.choices:
            pieces += 1
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "length", finish
    time.sleep(2.0)  # the holder is out of discovery
    before = stack.counters(only=[other])
    for q in ["Which shelf holds the amber box?", "Say hello."]:
        r = chat(client, PREFIX, q, max_tokens=8)
        assert r.choices[0].finish_reason in ("stop", "length"), r
    assert stack.counters(only=[other])[other]["queries"] > before[other]["queries"]
    code = stack.workers[holder].wait(timeout=60)
    assert code == 0, code
    return {"drained_stream_chunks": pieces, "holder_exit": code, "first": first.id is not None}


def main():
    with Stack(WORKER, MODEL, WORK, router_mode="kv") as stack:
        client = OpenAI(base_url=stack.url + "/v1", api_key="none", timeout=120, max_retries=0)
        summary = {"basic": whole_and_streamed(client)}
        holder, summary["route"] = route_to_holder(client, stack)
        summary["disconnect"] = disconnect_cancels(client, stack)
        summary["drain"] = sigterm_drains(client, stack, holder)
    print(json.dumps(summary))
    print("ok")


if __name__ == "__main__":
    main()
