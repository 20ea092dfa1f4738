"""The kvsched Python module: a serving loop, errors as exceptions, the seeds' PEFT bug (written from
Python), prefix reuse, disaggregated transfers and the reference-shaped shim."""

import pathlib
import re

import pytest

import kvsched


def small(**kw):
    args = dict(tokens_per_block=16, gpu_pages=96, host_pages=64, max_blocks_per_request=32,
                max_requests=32, max_num_tokens=256, chunk_unit=64, adapter_device_pages=4,
                adapter_host_pages=16)
    args.update(kw)
    return kvsched.Scheduler(**args)


def run_to_completion(s, out_len, max_passes=10000):
    """Passes until every request produced `out_len` tokens; returns (passes, produced)."""
    produced = {}
    passes = 0
    while len(s) and passes < max_passes:
        out = s.schedule()
        s.ensure_batch()
        s.take_moves()
        for e in out.context:
            if e.last:
                produced[e.id] = produced.get(e.id, 0) + 1
        for e in out.generation:
            produced[e.id] = produced.get(e.id, 0) + 1
            assert s.page_table(e.id), "a batched request has pages"
        for e in out.recompute_paused:
            produced[e.id] = 0
        s.complete_step()
        for e in out.generation:
            if produced[e.id] >= out_len:
                s.finish(e.id)
        passes += 1
    return passes, produced


def admitted_and_yielded(s, passes):
    """Runs `passes` passes; per pass, the ids of the contexts it scheduled and of those it paused."""
    seen = []
    for _ in range(passes):
        out = s.schedule()
        s.ensure_batch()
        s.take_moves()
        seen.append(([e.id for e in out.context], [e.id for e in out.paused + out.recompute_paused]))
        s.complete_step()
    return seen


def test_priority_admission_makes_a_running_lower_priority_yield():
    s = small(admission="priority", max_batch=1)
    s.submit(1, 16, max_new_tokens=32, priority=9)
    s.schedule(); s.ensure_batch(); s.take_moves(); s.complete_step()
    s.submit(2, 16, max_new_tokens=4, priority=0)
    seen = admitted_and_yielded(s, 3)
    # Refused for the batch slot, then request 1 yields and request 2 runs.
    assert seen[0] == ([], []) and seen[1] == ([2], [1]), seen
    with pytest.raises(kvsched.KvschedError):
        kvsched.Scheduler(admission="lottery")


def test_a_service_class_within_its_share_takes_a_batch_slot_back():
    # Class 0 has one batch slot of two; class 1's decodes hold both until class 0's request comes.
    s = small(max_batch=2, shares=[(1, 0, 0)])
    s.submit(1, 16, max_new_tokens=32, service_class=1)
    s.submit(2, 16, max_new_tokens=32, service_class=1)
    s.schedule(); s.ensure_batch(); s.take_moves(); s.complete_step()
    s.submit(3, 16, max_new_tokens=4, service_class=0)
    seen = admitted_and_yielded(s, 2)
    # Refused for the batch slot, then the newest borrower yields and request 3 runs.
    assert seen == [([], []), ([3], [2])], seen
    with pytest.raises(kvsched.KvschedError):
        small(shares=[(0, 0, 0)] * 5)
    with pytest.raises(kvsched.KvschedError):
        small(max_batch=2, shares=[(3, 0, 0)])
    with pytest.raises(kvsched.KvschedError):
        s.submit(9, 16, service_class=4)


def test_a_step_budget_in_time_caps_a_chunk_beside_decodes():
    # 10 µs a step, 1 µs a decode and a prefill token: a 100 µs target leaves 89 tokens, 80 in units of 16.
    s = small(chunk_unit=16, max_num_tokens=512, itl_target_us=100,
              step_cost=(10_000_000, 1_000_000, 1_000_000, 0, 0))
    s.submit(1, 16, max_new_tokens=8)
    s.schedule(); s.ensure_batch(); s.take_moves(); s.complete_step()
    s.submit(2, 400, max_new_tokens=1)
    out = s.schedule()
    assert [e.id for e in out.generation] == [1]
    assert [(e.id, e.tokens) for e in out.context] == [(2, 80)], out.context


def test_a_serving_loop_finishes_every_request():
    s = small()
    s.register_adapter(100, 2)
    s.register_adapter(101, 2)
    for i in range(24):
        lora = None if i % 3 == 0 else 100 + i % 2
        hashes = [7000 + b for b in range(4)] + [1000 * (i + 1) + b for b in range(2)]
        s.submit(i, 96 + 16 * (i % 4), max_new_tokens=12, lora_task=lora, hashes=hashes)
    passes, produced = run_to_completion(s, 12)
    assert len(s) == 0
    assert len(produced) == 24 and all(n >= 12 for n in produced.values())


def test_errors_are_exceptions_with_the_cores_messages_and_change_nothing():
    s = small()
    s.submit(1, 64, max_new_tokens=4)
    with pytest.raises(kvsched.DuplicateRequest, match="request id 1 is already in use"):
        s.submit(1, 64)
    with pytest.raises(kvsched.RequestTooLarge, match="KV tokens"):
        s.submit(2, 10_000)
    with pytest.raises(kvsched.AdapterError):
        s.submit(3, 64, lora_task=999)
    with pytest.raises(ValueError):
        s.submit(4, 64, kind="sideways")
    assert len(s) == 1
    with pytest.raises(kvsched.StaleOutput):
        s.complete_step()
    with pytest.raises(kvsched.UnknownRequest, match="request id 42 names no live request"):
        s.finish(42)
    with pytest.raises(kvsched.KvschedError):
        s.end_send(1)
    with pytest.raises(kvsched.KvschedError, match="max_requests"):
        kvsched.Scheduler(max_requests=0)
    out = s.schedule()
    assert [e.id for e in out.context] == [1]
    assert out.context is out.context, "a list is built once, not on every access"
    s.complete_step()
    with pytest.raises(kvsched.StaleOutput):
        s.complete_step()


def seeds(victim):
    """The seeds' bug (TensorRT-LLM #18407), from Python: a device adapter cache with room for one
    adapter; A decodes on adapter 1 holding four of the five GPU pages, B arrives on adapter 2. A's
    next step needs a page: A is suspended to the host tier (self-evicted, or evicted by F whose own
    step needs a page). Suspension returns A's lease, so B is admitted in the same pass and its
    adapter loads; when A's KV comes back it holds a lease again (its adapter reloads) before it is
    batched."""
    s = kvsched.Scheduler(tokens_per_block=4, gpu_pages=5, host_pages=8, max_blocks_per_request=8,
                          max_requests=4, max_batch=100, max_num_tokens=1024, chunk_unit=0,
                          prefix_cache=False, adapter_device_pages=1, adapter_host_pages=8)
    s.register_adapter(1, 1)
    s.register_adapter(2, 1)
    s.submit(5, 4 if victim else 3, max_new_tokens=1)          # F, no adapter
    s.submit(1, 4, max_new_tokens=1, lora_task=2)              # B, held back
    s.set_inflight(1, True)
    s.submit(0, 16, max_new_tokens=1, lora_task=1)             # A
    s.schedule()
    s.ensure_batch()
    s.take_moves()
    s.complete_step()
    assert s.gpu_free == 0
    s.set_inflight(1, False)
    out = s.schedule()
    assert [e.id for e in out.paused] == [0], "A is suspended"
    assert [e.id for e in out.context] == [1], "B is admitted in the same pass"
    assert s.ensure_batch() == [2], "B's adapter loads: A's device copy is evictable"
    assert any(not m.from_host for m in s.take_moves()), "A's pages go down to the host tier"
    s.complete_step()
    s.finish(1)
    s.finish(5)
    out = s.schedule()
    assert [e.id for e in out.resumed] == [0]
    assert [e.id for e in out.generation] == [0]
    assert s.ensure_batch() == [1], "A's adapter comes back with its lease"
    assert any(m.from_host for m in s.take_moves()), "A's pages come back up"
    s.complete_step()


def test_the_seeds_peft_bug_is_fixed_when_a_victim_is_evicted():
    seeds(victim=True)


def test_the_seeds_peft_bug_is_fixed_when_the_request_evicts_itself():
    seeds(victim=False)


def test_prefix_reuse_skips_the_cached_blocks():
    s = small()
    hashes = [11, 12, 13, 14]
    kvsched.RequestSpec(1, 70, max_new_tokens=2, hashes=hashes).submit_to(s)
    first = s.schedule().context[0]
    s.complete_step()
    s.submit(2, 70, max_new_tokens=2, hashes=hashes)
    out = s.schedule()
    second = [e for e in out.context if e.id == 2][0]
    # The second prompt's four cached blocks (64 tokens) are reused: it computes the rest.
    assert first.tokens == 70 and second.tokens == 70 - 64, (first, second)


def test_a_fork_shares_its_parents_full_pages_and_computes_the_rest():
    s = small()
    s.submit(1, 70, max_new_tokens=4, hashes=[11, 12, 13, 14])
    s.schedule()
    s.complete_step()
    shared = [s.fork(1, child, 70, max_new_tokens=4) for child in (2, 3)]
    assert shared == [64, 64], shared
    assert s.page_table(2)[:4] == s.page_table(1)[:4] == s.page_table(3)[:4]
    out = s.schedule()
    chunks = sorted((e.id, e.tokens) for e in out.context)
    assert chunks == [(2, 6), (3, 6)], chunks
    s.complete_step()
    with pytest.raises(kvsched.KvschedError, match="adapter"):
        s.fork(1, 4, 70, lora_task=7)
    with pytest.raises(kvsched.UnknownRequest):
        s.fork(9, 4, 70)
    plain = small(prefix_cache=False)
    plain.submit(1, 70, max_new_tokens=4)
    plain.schedule()
    plain.complete_step()
    with pytest.raises(kvsched.KvschedError, match="prefix cache"):
        plain.fork(1, 2, 70)


def test_a_disaggregated_request_is_sent_by_one_engine_and_received_by_another():
    p, d = small(), small()
    free = p.gpu_free
    p.submit(42, 100, max_new_tokens=8, kind="context_only")
    for _ in range(4):
        p.schedule()
        p.complete_step()
    assert p.gpu_free < free, "the send keeps its pages"
    out = p.schedule()
    assert not out.context and not out.generation
    p.complete_step()
    d.submit(42, 100, max_new_tokens=8, kind="disagg_generation")
    out = d.schedule()
    assert [e.id for e in out.disagg] == [42]
    d.complete_step()
    with pytest.raises(kvsched.KvschedError, match="not receiving"):
        d.end_receive(42)
    d.start_receive(42)
    d.end_receive(42)
    p.end_send(42)
    assert p.gpu_free == free and len(p) == 0
    out = d.schedule()
    assert [e.id for e in out.generation] == [42]
    d.complete_step()


class LlmRequest:
    """An engine's own request object, as the reference's executor has."""

    def __init__(self, rid):
        self.py_request_id = rid


def test_the_reference_shaped_shim_returns_the_engines_own_objects():
    shim = kvsched.ReferenceShapedScheduler(small())
    reqs = [LlmRequest(i) for i in range(3)]
    for r in reqs:
        shim.add_request(r, kvsched.RequestSpec(r.py_request_id, 40, max_new_tokens=2))
    with pytest.raises(ValueError):
        shim.add_request(LlmRequest(9), kvsched.RequestSpec(8, 40))
    out = shim.schedule_request(reqs, inflight_request_ids=[2])
    assert out.context_requests == reqs[:2], "request 2 is in flight"
    assert out.num_fitting_requests == 2
    assert out.chunk_tokens == {0: 40, 1: 40}
    shim.complete_step()
    out = shim.schedule_request(reqs)
    assert out.generation_requests == reqs[:2]
    assert out.context_requests == [reqs[2]]
    assert isinstance(out, kvsched.SchedulerOutput)
    shim.complete_step()
    for r in reqs:
        shim.finish(r)
    assert len(shim.scheduler) == 0


def test_a_submission_past_max_requests_is_refused_and_a_freed_slot_is_reused():
    """`max_requests` is the number of requests the scheduler holds: a fifth submit with 4 is a
    CapacityError (it used to be accepted into a slot the KV pool does not have, never scheduled,
    and `page_table` of it panicked); after one finishes, the next submit is accepted and runs."""
    s = small(max_requests=4, prefix_cache=False)
    for i in range(4):
        s.submit(i, 16, max_new_tokens=2)
    with pytest.raises(kvsched.CapacityError, match="request table"):
        s.submit(4, 16, max_new_tokens=2)
    assert len(s) == 4
    out = s.schedule()
    s.ensure_batch()
    s.take_moves()
    s.complete_step()
    assert sorted(e.id for e in out.context) == [0, 1, 2, 3]
    s.finish(0)
    s.submit(4, 16, max_new_tokens=2)
    assert s.page_table(4) == [], "no pages before its first chunk"
    passes, produced = run_to_completion(s, 2)
    assert produced.get(4) == 2, produced


def test_kv_events_name_the_blocks_by_their_keys_and_encode_vllms_batch():
    import msgspec

    s = kvsched.Scheduler(tokens_per_block=16, gpu_pages=8, host_pages=0, max_blocks_per_request=8,
                          max_requests=4, kv_events=64)
    hashes = [11, 12, 13, 14]
    s.submit(1, 64, max_new_tokens=4, hashes=hashes)
    root = s.prefix_root(1)
    keys, k = [], root
    for h in hashes:
        k = kvsched.chain(k, h)
        keys.append(k)
    out = s.schedule()
    assert [e.id for e in out.context] == [1]
    s.complete_step()
    events = s.take_kv_events()
    assert [(e.kind, e.tier, e.key) for e in events] == [("stored", "gpu", k) for k in keys]
    assert [e.parent for e in events] == [root] + keys[:-1]
    assert s.take_kv_events() == [], "drained"
    # The blocks are evicted when a second prompt needs the pool: removed events for them.
    s.finish(1)
    s.submit(2, 112, max_new_tokens=4, hashes=[21, 22, 23, 24, 25, 26, 27])
    s.schedule()
    s.complete_step()
    removed = [e.key for e in s.take_kv_events() if e.kind == "removed"]
    assert removed and set(removed) <= set(keys)
    with pytest.raises(kvsched.UnknownRequest):
        s.prefix_root(1)

    # The engine publishes them in vLLM's format: a first block's parent is None (its root is no block).
    tokens = list(range(64))
    wire = [
        {"type": "BlockStored", "block_hashes": keys, "parent_block_hash": None,
         "token_ids": tokens, "block_size": 16, "lora_id": None, "medium": "GPU",
         "lora_name": "sql"},
        {"type": "BlockRemoved", "block_hashes": removed, "medium": "GPU"},
        {"type": "AllBlocksCleared"},
    ]
    batch = msgspec.msgpack.decode(kvsched.encode_kv_events(wire, 1.5, data_parallel_rank=2))
    ts, decoded, rank = batch
    assert (ts, rank) == (1.5, 2)
    assert decoded[0]["type"] == "BlockStored" and list(decoded[0])[0] == "type"
    assert decoded[0]["block_hashes"] == keys and decoded[0]["parent_block_hash"] is None
    assert decoded[0]["token_ids"] == tokens and decoded[0]["block_size"] == 16
    assert decoded[0]["lora_name"] == "sql" and decoded[0]["lora_id"] is None
    assert decoded[0]["medium"] == "GPU"
    assert decoded[1] == {"type": "BlockRemoved", "block_hashes": removed, "medium": "GPU"}
    assert decoded[2] == {"type": "AllBlocksCleared"}

    # Bad events are refused with the field named.
    for bad, field in [
        ({"type": "BlockAdded"}, "type"),
        ({"type": "BlockRemoved"}, "block_hashes"),
        ({**wire[0], "token_ids": tokens[:-1]}, "token_ids"),
        ({**wire[0], "medium": "DISK"}, "medium"),
        ({**wire[0], "block_hashes": [-1]}, "block_hashes"),
    ]:
        with pytest.raises(ValueError, match=field):
            kvsched.encode_kv_events([bad], 0.0)
    with pytest.raises(kvsched.KvschedError, match="prefix cache"):
        kvsched.Scheduler(prefix_cache=False, kv_events=16)


def test_buffers_hold_the_lists_and_an_incremental_pass_copies_nothing():
    import struct

    s = small()
    for i in range(4):
        s.submit(id=i, prompt=20, max_new_tokens=50)
    b = s.schedule_buffers()
    assert len(b.context) == 4 * struct.calcsize(kvsched.ENTRY_FORMAT) == 96
    assert list(kvsched.ids(b.context)) == [0, 1, 2, 3]
    first = [struct.unpack_from(kvsched.ENTRY_FORMAT, b.context, 24 * k) for k in range(4)]
    assert [(e[0], e[2], e[5]) for e in first] == [(i, 20, 1) for i in range(4)]
    d = s.take_delta()
    assert list(kvsched.ids(d.entered)) == [0, 1, 2, 3] and d.left == b"" and d.changed == b""
    s.ensure_batch()
    s.complete_step()
    # The prompts are done: the four decode (another list, so changed), then steady passes keep the
    # batch and hand back the very same buffers.
    b = s.schedule_buffers()
    assert list(kvsched.ids(b.generation)) == [0, 1, 2, 3]
    assert list(kvsched.ids(s.take_delta().changed)) == [0, 1, 2, 3]
    s.complete_step()
    steady = s.schedule_buffers()
    for _ in range(5):
        s.complete_step()
        again = s.schedule_buffers()
        assert again.generation is steady.generation, "nothing copied"
        assert again.pass_number == steady.pass_number + 1
        d = s.take_delta()
        assert (d.entered, d.left, d.changed) == (b"", b"", b"")
        steady = again
    # The object API sees the same lists.
    s.complete_step()
    s.finish(2)
    out = s.schedule()
    s.complete_step()
    b = s.schedule_buffers()
    assert [e.id for e in out.generation] == [0, 1, 3] == list(kvsched.ids(b.generation))
    assert list(kvsched.ids(s.take_delta().left)) == [2]


def test_a_request_too_large_for_its_page_table_names_the_limit_and_the_setting():
    # 32 pages of 16 tokens a request (the pool has 96): the page table is the limit.
    s = small()
    with pytest.raises(kvsched.RequestTooLarge) as e:
        s.submit(2, 10_000)
    msg = str(e.value)
    assert "at most 512" in msg, msg
    assert "max_blocks_per_request = 32 pages of 16 tokens" in msg, msg
    assert "raise max_blocks_per_request" in msg, msg
    # A pool smaller than the page table: the pool is the limit, and gpu_pages raises it.
    s = small(gpu_pages=8)
    with pytest.raises(kvsched.RequestTooLarge, match=r"gpu_pages = 8 pages of 16 tokens"):
        s.submit(2, 200)
    assert len(s) == 0


def test_a_duplicate_id_is_a_duplicate_request_not_an_unknown_one():
    s = small()
    s.submit(5, 64)
    with pytest.raises(kvsched.DuplicateRequest, match="request id 5 is already in use") as e:
        s.submit(5, 32)
    assert not isinstance(e.value, kvsched.UnknownRequest)
    assert isinstance(e.value, kvsched.KvschedError)
    assert len(s) == 1 and s.page_table(5) == []


def test_exceptions_print_as_kvsched_names():
    for name in ["KvschedError", "CapacityError", "RequestTooLarge", "UnknownRequest",
                 "DuplicateRequest", "AdapterError", "DeadlockError", "StaleOutput"]:
        cls = getattr(kvsched, name)
        assert cls.__module__ == "kvsched", (name, cls.__module__)
        assert repr(cls) == f"<class 'kvsched.{name}'>"
    with pytest.raises(kvsched.UnknownRequest) as e:
        small().finish(3)
    assert "_native" not in repr(e.value) and "_native" not in e.typename
    assert e.typename == "UnknownRequest"


def test_the_version_is_the_crates_and_the_packages():
    here = pathlib.Path(__file__).resolve().parents[1]
    for f in ["Cargo.toml", "pyproject.toml"]:
        version = re.search(r'^version = "([^"]+)"', (here / f).read_text(), re.M).group(1)
        assert kvsched.__version__ == version, f


def test_an_output_has_a_useful_repr():
    s = small()
    for i in range(12):
        s.submit(i, 16, max_new_tokens=2)
    out = s.schedule()
    r = repr(out)
    assert r.startswith("Output(pass_number=1, context=[0, 1, 2, 3, 4, 5, 6, 7, +4 more], "), r
    assert "generation=[], paused=[], recompute_paused=[], disagg=[], resumed=[])" in r, r
    s.complete_step()
    r = repr(s.schedule())
    assert "pass_number=2" in r and "generation=[0, 1, 2, 3, 4, 5, 6, 7, +4 more]" in r, r


def test_dir_shows_the_modules_own_names_only():
    public = {n for n in dir(kvsched) if not n.startswith("_")}
    assert public == set(kvsched.__all__), public ^ set(kvsched.__all__)
    for helper in ["Any", "Dict", "Iterable", "List", "Optional", "dataclass", "field", "asdict"]:
        assert helper not in public
    assert all(hasattr(kvsched, n) for n in kvsched.__all__)


def test_block_hashes_beyond_the_prompts_full_pages_are_refused():
    s = small()
    # 40 tokens in 16-token pages: 2 full pages, so at most 2 hashes.
    s.submit(1, 40, hashes=[11, 12])
    with pytest.raises(kvsched.KvschedError,
                       match=r"request 2: 3 block hashes, but a prompt of 40 tokens has 2 full pages"):
        s.submit(2, 40, hashes=[11, 12, 13])
    with pytest.raises(kvsched.KvschedError, match="has 0 full pages"):
        s.submit(3, 15, hashes=[1])
    assert len(s) == 1
