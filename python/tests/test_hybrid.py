"""A hybrid recurrent model's scheduler from Python (issue 46): the state keyword arguments give it a
state group; every scheduled entry names its live GPU state slot; take_state_moves and take_captures
hand out the state copies and the snapshots. A plain scheduler is unchanged."""

import pytest

import kvsched

TPB = 16


def hybrid(max_requests, gpu_pages, host_pages, gpu, host, snapshots, **kw):
    """Pages of 16 tokens, whole prompts, no recompute pause; a state group of `gpu` and `host`
    slots, `snapshots` of them at most for snapshots, a snapshot point every page."""
    args = dict(tokens_per_block=TPB, gpu_pages=gpu_pages, host_pages=host_pages,
                max_blocks_per_request=16, max_requests=max_requests, max_batch=max_requests,
                chunk_unit=0, recompute_pause=False, state_slot_bytes=4096, state_gpu_slots=gpu,
                state_host_slots=host, state_snapshot_slots=snapshots,
                state_snapshot_interval=TPB)
    args.update(kw)
    return kvsched.Scheduler(**args)


def step(s):
    """A pass and what it hands out before the step: the output, the page moves, the state moves
    and the captures (taken in that order, as an engine does)."""
    out = s.schedule()
    s.ensure_batch()
    return out, s.take_moves(), s.take_state_moves(), s.take_captures()


def test_a_hybrid_scheduler_names_each_scheduled_requests_state_slot():
    s = hybrid(4, 64, 64, 4, 4, 0)
    for i in (1, 2, 3):
        s.submit(i, 40)
    out, _, states, captures = step(s)
    live = [e.state_slot for e in out.context]
    assert len(set(live)) == 3 and all(0 <= g < 4 for g in live), out.context
    assert states == [] and captures == []
    assert "state_slot=" in repr(out.context[0])
    s.complete_step()
    out2, *_ = step(s)
    assert [(e.id, e.state_slot) for e in out2.generation] == \
        [(e.id, e.state_slot) for e in out.context]
    s.complete_step()
    s.finish(2)
    s.submit(4, 40)
    out3, *_ = step(s)
    (four,) = out3.context
    assert four.state_slot not in [e.state_slot for e in out3.generation]
    with pytest.raises(kvsched.KvschedError, match="cannot fork"):
        s.fork(1, 9, 32)


def test_a_plain_scheduler_has_no_state_slots_and_no_state_logs():
    s = kvsched.Scheduler(max_requests=4)
    s.submit(1, 40)
    out, _, states, captures = step(s)
    assert [e.state_slot for e in out.context] == [None]
    assert "state_slot" not in repr(out.context[0])
    assert states == [] and captures == []


def run(s, tokens, done, limit=200):
    """Steps until done(steps) (at most `limit`): each request decodes `tokens` steps after its
    prompt, then finishes. Returns every step's handout."""
    decoded, steps = {}, []
    while len(steps) < limit:
        handout = step(s)
        s.complete_step()
        for e in handout[0].generation:
            decoded[e.id] = decoded.get(e.id, 0) + 1
            if decoded[e.id] == tokens:
                s.finish(e.id)
        steps.append(handout)
        if done(steps):
            break
    return steps


def test_a_suspension_moves_the_state_to_the_host_and_a_resumption_brings_it_back():
    # Six GPU pages: two prompts of 40 tokens take three each; the page one needs for its decode
    # suspends the other to the host tier.
    s = hybrid(2, 6, 32, 2, 2, 0)
    s.submit(1, 40)
    s.submit(2, 40)
    steps = run(s, 30, lambda st: bool(st[-1][0].resumed))
    at = next(k for k, (out, *_) in enumerate(steps) if out.paused)
    out, moves, states, _ = steps[at]
    x = out.paused[0]
    assert x.state_slot is None, "a paused request has no live slot"
    was = next(e.state_slot for o, *_ in reversed(steps[:at]) for e in o.generation
               if e.id == x.id)
    (to_host,) = [m for m in states if m.request == x.id]
    assert (to_host.op, to_host.src) == ("to_host", was)
    assert any(m.request == x.id and not m.from_host for m in moves)
    out, moves, states, _ = steps[-1]
    (r,) = [e for e in out.resumed if e.id == x.id]
    (to_gpu,) = [m for m in states if m.request == x.id]
    assert (to_gpu.op, to_gpu.src, to_gpu.dst) == ("to_gpu", to_host.dst, r.state_slot)
    assert any(m.request == x.id and m.from_host for m in moves)
    assert "to_gpu" in repr(to_gpu)


def test_a_prefix_hit_restores_a_snapshot_that_a_capture_wrote():
    s = hybrid(2, 64, 0, 4, 0, 2)
    s.submit(1, 70, hashes=[11, 12, 13, 14])
    out, _, _, captures = step(s)
    (c,) = captures
    assert (c.request, c.position) == (1, 64)
    assert c.slot != out.context[0].state_slot
    s.complete_step()
    step(s)
    s.complete_step()
    s.finish(1)
    s.submit(2, 80, hashes=[11, 12, 13, 14, 15])
    out, _, states, captures = step(s)
    (x,) = out.context
    assert (x.id, x.tokens) == (2, 16), "the chunk after the hit"
    (restore,) = [m for m in states if m.request == 2]
    assert (restore.op, restore.src, restore.dst) == ("restore", c.slot, x.state_slot)
    assert [(k.request, k.position) for k in captures] == [(2, 80)]


@pytest.mark.parametrize("kw,why", [
    (dict(state_snapshot_slots=4), "snapshots must leave"),
    (dict(state_snapshot_interval=24), "whole number of attention blocks"),
    (dict(state_slot_bytes=0), "at least one byte"),
    (dict(state_gpu_slots=2, state_host_slots=1), "more live requests"),
    (dict(state_gpu_slots=0), "state_gpu_slots = 0"),
])
def test_bad_state_settings_are_refused_with_a_message(kw, why):
    with pytest.raises(kvsched.KvschedError, match=why):
        hybrid(4, 64, 64, 4, 4, 1, **kw)
