"""The official `openai` client against a running `kvsched serve`.

Run by server/tests/openai_client.rs with KVSCHED_URL (the server's base URL), KVSCHED_BASE (the base
model's name) and KVSCHED_ADAPTER (an adapter's name). Every check is greedy (temperature 0), so
streamed and whole responses must carry the same text. Prints one line per check, then "N checks passed".
"""

import os
import sys

import openai

URL = os.environ["KVSCHED_URL"]
BASE = os.environ["KVSCHED_BASE"]
ADAPTER = os.environ["KVSCHED_ADAPTER"]

client = openai.OpenAI(base_url=URL + "/v1", api_key="unused", max_retries=0, timeout=120)
checks = []


def check(name):
    def run(f):
        f()
        checks.append(name)
        print("ok:", name, flush=True)
        return f
    return run


@check("models.list names the base model and the adapter")
def _():
    ids = [m.id for m in client.models.list()]
    assert ids == [BASE, ADAPTER], ids


def complete(model, stream, **kw):
    args = dict(model=model, prompt="The three primary colours are", max_tokens=12, temperature=0)
    args.update(kw)
    if not stream:
        r = client.completions.create(**args)
        return r.choices[0].text, r.choices[0].finish_reason, r.usage
    text, reason, usage = "", None, None
    for chunk in client.completions.create(stream=True, stream_options={"include_usage": True}, **args):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.text
            reason = c.finish_reason or reason
    return text, reason, usage


@check("completions, whole and streamed (with usage), the same text")
def _():
    whole = complete(BASE, False)
    streamed = complete(BASE, True)
    assert whole[0] and whole[0] == streamed[0], (whole, streamed)
    assert whole[1] == streamed[1] == "length", (whole[1], streamed[1])
    assert whole[2].completion_tokens == streamed[2].completion_tokens == 12
    assert whole[2].total_tokens == whole[2].prompt_tokens + 12


@check("an adapter as `model`: its own text, whole and streamed")
def _():
    base = complete(BASE, False)[0]
    tuned = complete(ADAPTER, False)[0]
    assert tuned == complete(ADAPTER, True)[0]
    assert tuned != base, (tuned, base)


def chat(model, stream):
    args = dict(model=model, messages=[{"role": "system", "content": "You are terse."},
                                       {"role": "user", "content": "What is the capital of Italy?"}],
                max_tokens=16, temperature=0)
    if not stream:
        r = client.chat.completions.create(**args)
        assert r.choices[0].message.role == "assistant"
        return r.choices[0].message.content, r.usage.completion_tokens
    text, roles, usage = "", [], None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args):
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        for c in chunk.choices:
            text += c.delta.content or ""
            roles.append(c.delta.role)
    assert roles[0] == "assistant", roles
    return text, usage


@check("chat completions, whole and streamed, the same text")
def _():
    whole, streamed = chat(BASE, False), chat(BASE, True)
    assert whole[0] and whole == streamed, (whole, streamed)


@check("chat on the adapter")
def _():
    assert chat(ADAPTER, False) == chat(ADAPTER, True)


@check("a stop sequence ends the text before it")
def _():
    full = complete(BASE, False)[0]
    stop = full[len(full) // 2:][:2]
    text, reason, _ = complete(BASE, False, stop=[stop])
    assert text == full[:full.index(stop)] and reason == "stop", (text, full, stop)


@check("a seeded sample repeats for its seed")
def _():
    a = complete(BASE, False, seed=7, top_p=0.9, temperature=0.8)
    b = complete(BASE, True, seed=7, top_p=0.9, temperature=0.8)
    assert a[0] == b[0], (a, b)


@check("errors: BadRequestError naming the field, NotFoundError for an unknown model")
def _():
    try:
        client.completions.create(model=BASE, prompt="x", n=2)
        raise AssertionError("n=2 was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"] == "n", e.body
    try:
        client.completions.create(model=BASE, prompt="x", max_tokens=0)
        raise AssertionError("max_tokens=0 was accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "max_tokens", e.body
    try:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        assert e.status_code == 404 and e.body["code"] == "model_not_found", e.body


print(f"{len(checks)} checks passed")
sys.exit(0)
