"""The official `openai` client against a running `kvsched serve`.

Run by server/tests/openai_client.rs with KVSCHED_URL (the server's base URL), KVSCHED_BASE (the base
model's name) and KVSCHED_ADAPTER (an adapter's name). Every check is greedy (temperature 0) or seeded,
so streamed and whole responses must carry the same text. Prints one line per check, then "N checks passed".
"""

import json
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
        client.completions.create(model=BASE, prompt="x", n=2, best_of=1)
        raise AssertionError("best_of below n was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"] == "best_of", e.body
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


@check("models.retrieve: the base model and the adapter by id; NotFoundError for another")
def _():
    assert client.models.retrieve(BASE).id == BASE
    tuned = client.models.retrieve(ADAPTER)
    assert tuned.id == ADAPTER and tuned.parent == BASE, tuned
    try:
        client.models.retrieve("no-such-model")
        raise AssertionError("an unknown model was retrieved")
    except openai.NotFoundError as e:
        assert e.status_code == 404, e


@check("logprobs: completions' tokens and top_logprobs, chat's content entries")
def _():
    r = client.completions.create(model=BASE, prompt="The three primary colours are", max_tokens=6,
                                  temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6, lp
    assert "".join(lp.tokens) == r.choices[0].text, (lp.tokens, r.choices[0].text)
    for value, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert value <= 0 and len(top) <= 3 and max(top.values()) == value, (value, top)
    c = client.chat.completions.create(model=BASE, messages=[{"role": "user", "content": "Say hi."}],
                                       max_tokens=5, temperature=0, logprobs=True, top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert len(content) == c.usage.completion_tokens, (content, c.usage)
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2, entry
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob, entry


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "colour": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "age", "colour"],
    "additionalProperties": False,
}


def validate(value, schema):
    """A JSON schema check of the keywords PERSON uses (type, properties, required,
    additionalProperties, maxLength, minimum, maximum, enum)."""
    if "enum" in schema:
        assert value in schema["enum"], (value, schema)
    kind = schema.get("type")
    if kind == "object":
        assert isinstance(value, dict), value
        for key in schema.get("required", []):
            assert key in value, (key, value)
        if schema.get("additionalProperties") is False:
            assert set(value) <= set(schema["properties"]), value
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                validate(value[key], sub)
    elif kind == "string":
        assert isinstance(value, str) and len(value) <= schema.get("maxLength", len(value)), value
    elif kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), value
        assert schema.get("minimum", value) <= value <= schema.get("maximum", value), value


@check("response_format json_schema: the output parses and validates, whole and streamed")
def _():
    args = dict(model=BASE, temperature=0, max_tokens=80,
                messages=[{"role": "user", "content": "Describe a person as JSON."}],
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    whole = client.chat.completions.create(**args).choices[0].message.content
    person = json.loads(whole)
    validate(person, PERSON)
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       client.chat.completions.create(stream=True, **args) if c.choices)
    assert streamed == whole, (streamed, whole)


@check("cache_salt keys the prefix cache; usage.prompt_tokens_details.cached_tokens reports the hit")
def _():
    prompt = "A shared preamble that several tenants send, long enough to fill pages. " * 6
    def cached(salt):
        extra = {"cache_salt": salt} if salt else {}
        r = client.completions.create(model=BASE, prompt=prompt, max_tokens=2, temperature=0,
                                      extra_body=extra)
        return r.usage.prompt_tokens_details.cached_tokens
    first = cached(None)
    again = cached(None)
    assert again > first, (first, again)
    assert cached("tenant-b") == 0
    assert cached("tenant-b") == again


@check("n = 3: three choices, whole and streamed (indexed), each its seed's sample; the prompt counted once; beam search")
def _():
    args = dict(model=BASE, prompt="Once upon a time, in a small village,", max_tokens=10, temperature=0.9,
                seed=11)
    whole = client.completions.create(n=3, **args)
    assert [c.index for c in whole.choices] == [0, 1, 2], whole.choices
    texts = [c.text for c in whole.choices]
    assert len(set(texts)) > 1, texts
    for i in range(3):
        alone = client.completions.create(**{**args, "seed": 11 + i})
        assert alone.choices[0].text == texts[i], (i, alone.choices[0].text, texts)
        assert alone.usage.prompt_tokens == whole.usage.prompt_tokens
    assert whole.usage.completion_tokens <= 30 and whole.usage.total_tokens == (
        whole.usage.prompt_tokens + whole.usage.completion_tokens)
    streamed = ["", "", ""]
    for chunk in client.completions.create(stream=True, n=3, **args):
        for c in chunk.choices:
            streamed[c.index] += c.text
    assert streamed == texts, (streamed, texts)
    messages = [{"role": "user", "content": "Name a colour."}]
    chat = client.chat.completions.create(model=BASE, messages=messages, max_tokens=8, temperature=0.9,
                                          seed=3, n=3)
    chat_texts = [c.message.content for c in chat.choices]
    assert [c.index for c in chat.choices] == [0, 1, 2] and all(chat_texts), chat.choices
    streamed = ["", "", ""]
    for chunk in client.chat.completions.create(model=BASE, messages=messages, max_tokens=8,
                                                temperature=0.9, seed=3, n=3, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
    assert streamed == chat_texts, (streamed, chat_texts)
    beams = client.completions.create(model=BASE, prompt=args["prompt"], max_tokens=6, n=2,
                                      extra_body={"use_beam_search": True})
    assert [c.index for c in beams.choices] == [0, 1], beams.choices
    assert beams.choices[0].text != beams.choices[1].text, beams.choices


@check("priority without priority scheduling: the client's BadRequestError")
def _():
    try:
        client.completions.create(model=BASE, prompt="Hi", max_tokens=2, extra_body={"priority": 5})
    except openai.BadRequestError as e:
        assert "priority scheduling is not enabled" in str(e), e
    else:
        raise AssertionError("priority 5 was accepted under fcfs")
    r = client.completions.create(model=BASE, prompt="Hi", max_tokens=2, extra_body={"priority": 0})
    assert r.choices[0].text is not None


print(f"{len(checks)} checks passed")
sys.exit(0)
