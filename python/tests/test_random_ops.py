"""Random operations on the Python module (hypothesis's stateful testing), and the regression tests of
what a first random run found.

``RandomOps`` drives one ``kvsched.Scheduler`` (a small one, so that pools fill, requests suspend and
prefixes are shared) with random calls: adapters registered, requests of every kind submitted with
random prompts, adapters, salts and block hashes drawn from a small alphabet (so prompts share
prefixes), passes, adapter plans, page moves, steps, finishes, in-flight marks, transfers ended, KV
events taken, ids live, finished and never seen. After every step it checks:

- no call raised anything but the module's own exceptions (a ``PanicException`` is a ``BaseException``
  and fails the test), and a refused call changed nothing the module shows (the live requests, the free
  GPU pages, every live request's page table);
- ``len`` is the number of requests submitted and not yet finished or sent, and each has a page table;
- page tables are disjoint except for shared prefix pages: a page in two tables must sit at the same
  index ``j`` of both, and both requests must name the same block there, that is, the same block key
  ``chain(...chain(prefix_root, hashes[0])..., hashes[j])`` (the key the prefix cache matches blocks by:
  same adapter identity, same salt, same hashes up to ``j``). A page shared anywhere else is a bug.

The run is bounded and deterministic (``derandomize``, 150 examples of up to 50 steps, no example
database), and it must see shared prefix pages: a run that never shares a page would check nothing.
"""

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, rule,
                                 run_state_machine_as_test)

import kvsched

#: The module's own exceptions: a refusal raises one of these, nothing else.
OWN = (
    kvsched.KvschedError,
    kvsched.CapacityError,
    kvsched.RequestTooLarge,
    kvsched.UnknownRequest,
    kvsched.DuplicateRequest,
    kvsched.AdapterError,
    kvsched.DeadlockError,
    kvsched.StaleOutput,
)

TOKENS_PER_BLOCK = 4
IDS = st.integers(min_value=0, max_value=11)
KINDS = st.sampled_from(["plain"] * 6 + ["context_only", "disagg_generation"])
HOST = 1 << 31
NO_PAGE = (1 << 32) - 1

#: Across a run: pages seen in two tables (legitimately), and steps checked.
SEEN = {"shared": 0, "steps": 0}


def keys(root, hashes):
    """The block keys of a prompt: each block's parent key (the root for the first) chained with its hash."""
    out, key = [], root
    for h in hashes:
        key = kvsched.chain(key, h)
        out.append(key)
    return out


class RandomOps(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.s = None
        #: Live requests: id -> block keys of its prompt (none without a prefix cache).
        self.live = {}
        #: Live requests: id -> what it was submitted with.
        self.specs = {}

    @initialize(
        prefix_cache=st.booleans(),
        recompute_pause=st.booleans(),
        host_pages=st.sampled_from([0, 16]),
        gpu_pages=st.sampled_from([12, 24, 48]),
        max_requests=st.integers(min_value=1, max_value=6),
    )
    def build(self, prefix_cache, recompute_pause, host_pages, gpu_pages, max_requests):
        self.prefix_cache, self.gpu_pages, self.host_pages = prefix_cache, gpu_pages, host_pages
        self.s = kvsched.Scheduler(
            tokens_per_block=TOKENS_PER_BLOCK, gpu_pages=gpu_pages, host_pages=host_pages,
            max_blocks_per_request=16, max_requests=max_requests, max_batch=4, max_num_tokens=64,
            chunk_unit=8, recompute_pause=recompute_pause, prefix_cache=prefix_cache,
            adapter_device_pages=4, adapter_host_pages=8, kv_events=32 if prefix_cache else 0)

    # What the module shows: a refused call must leave it as it was.
    def shown(self):
        tables = {}
        for i in self.live:
            try:
                tables[i] = self.s.page_table(i)
            except OWN as e:  # checked by the invariant; here only compared
                tables[i] = type(e)
        return len(self.s), self.s.gpu_free, tables

    def attempt(self, call, *args, **kwargs):
        """Makes a call; True if it was done. A refusal must be the module's and change nothing."""
        before = self.shown()
        try:
            call(*args, **kwargs)
        except OWN as e:
            assert str(e), f"{type(e).__name__} without a message"
            assert self.shown() == before, f"a refused {call.__name__} ({e}) changed the scheduler"
            return False
        return True

    @rule(task=st.integers(min_value=0, max_value=3), pages=st.integers(min_value=0, max_value=4))
    def register_adapter(self, task, pages):
        self.attempt(self.s.register_adapter, task, pages)

    @rule(
        id=IDS,
        prompt=st.integers(min_value=0, max_value=44),
        max_new_tokens=st.integers(min_value=0, max_value=16),
        lora_task=st.sampled_from([None, None, None, None, 0, 1]),
        beam=st.sampled_from([1, 1, 1, 2]),
        kind=KINDS,
        salt=st.sampled_from([0, 0, 1]),
        alphabet=st.lists(st.integers(min_value=1, max_value=3), max_size=12),
        extra=st.booleans(),
    )
    def submit(self, id, prompt, max_new_tokens, lora_task, beam, kind, salt, alphabet, extra):
        # One hash a full prompt block (sometimes more than that, which is refused), from a 3-letter
        # alphabet: prompts share prefixes.
        full = prompt // TOKENS_PER_BLOCK
        hashes = alphabet[: full + (2 if extra else 0)]
        self.add(id, prompt, max_new_tokens=max_new_tokens, lora_task=lora_task, beam=beam, kind=kind,
                 hashes=hashes, cache_salt=salt)

    @rule(id=IDS, data=st.data(), tail=st.lists(st.integers(min_value=1, max_value=3), max_size=3))
    def submit_sharing(self, id, data, tail):
        """A request whose prompt starts as a live one's: same adapter, salt and leading block hashes."""
        if not self.specs:
            return
        other = self.specs[data.draw(st.sampled_from(sorted(self.specs)))]
        hashes = other["hashes"][: data.draw(st.integers(0, len(other["hashes"])))] + tail
        prompt = TOKENS_PER_BLOCK * len(hashes) + data.draw(st.integers(0, TOKENS_PER_BLOCK - 1))
        self.add(id, prompt, max_new_tokens=4, lora_task=other["lora_task"], hashes=hashes,
                 cache_salt=other["cache_salt"])

    def add(self, id, prompt, **kw):
        if self.attempt(self.s.submit, id, prompt, **kw):
            assert id not in self.live, f"a duplicate id {id} was accepted"
            hashes = kw["hashes"]
            self.live[id] = keys(self.s.prefix_root(id), hashes) if self.prefix_cache else []
            self.specs[id] = dict(kw, prompt=prompt)

    def forget(self, id):
        del self.live[id]
        del self.specs[id]

    @rule()
    def schedule(self):
        before = self.shown()
        try:
            out = self.s.schedule()
        except OWN as e:
            assert self.shown() == before, f"a refused schedule ({e}) changed the scheduler"
            return
        for e in [*out.context, *out.generation, *out.paused, *out.recompute_paused, *out.disagg,
                  *out.resumed]:
            assert e.id in self.live, f"listed request {e.id} is not live"

    @rule(finish_after=st.integers(min_value=0, max_value=3))
    def serve(self, finish_after):
        """One serving iteration: a pass, its adapter plan, its page moves, its step; then a request
        scheduled for decode may finish (so prompts are computed and cached, and rows freed)."""
        if not self.attempt(self.s.schedule):
            return
        self.attempt(self.s.ensure_batch)
        self.take_moves()
        self.attempt(self.s.complete_step)
        if finish_after == 0 and self.live:
            self.finish(next(iter(self.live)))

    @rule()
    def ensure_batch(self):
        self.attempt(self.s.ensure_batch)

    @rule()
    def take_moves(self):
        for m in self.s.take_moves():
            src, dst = (self.host_pages, self.gpu_pages) if m.from_host else (self.gpu_pages, self.host_pages)
            assert 0 <= m.src < src and 0 <= m.dst < dst, f"a move out of its tiers: {m.src} -> {m.dst}"

    @rule()
    def complete_step(self):
        self.attempt(self.s.complete_step)

    @rule(id=IDS)
    def finish(self, id):
        if self.attempt(self.s.finish, id):
            self.forget(id)

    @rule(id=IDS, inflight=st.booleans())
    def set_inflight(self, id, inflight):
        self.attempt(self.s.set_inflight, id, inflight)

    @rule(id=IDS, delivered=st.booleans(), step=st.sampled_from(["end_send", "start_receive",
                                                                  "end_receive"]))
    def transfer(self, id, delivered, step):
        """Disaggregated serving: a send ends (the request leaves), a receive starts or ends."""
        if step == "end_send":
            if self.attempt(self.s.end_send, id, delivered):
                self.forget(id)
        elif step == "start_receive":
            self.attempt(self.s.start_receive, id)
        else:
            self.attempt(self.s.end_receive, id, delivered)

    @rule()
    def take_kv_events(self):
        for e in self.s.take_kv_events():
            assert e.kind in ("stored", "removed", "cleared"), e

    @rule(id=IDS, what=st.sampled_from(["prefix_root", "page_table"]))
    def read(self, id, what):
        self.attempt(getattr(self.s, what), id)

    @invariant()
    def tables_are_disjoint_but_for_shared_prefix_blocks(self):
        if self.s is None:
            return
        SEEN["steps"] += 1
        assert len(self.s) == len(self.live), "len against the requests submitted and not removed"
        # Every live request has a page table (page_table raises otherwise).
        tables = {i: self.s.page_table(i) for i in self.live}
        assert all(len(t) <= 16 for t in tables.values())
        SEEN["shared"] += shared_pages(tables, self.live)


def shared_pages(tables, block_keys):
    """Checks that `tables` (id -> page table) are disjoint but for shared prefix blocks, given each
    request's block keys; returns how many table entries name a page an earlier table named."""
    owner, shared = {}, 0  # page -> (request, index in its table)
    for i, table in tables.items():
        mine = block_keys[i]
        for j, page in enumerate(table):
            if page == NO_PAGE:
                continue
            if page not in owner:
                owner[page] = (i, j)
                continue
            k, jk = owner[page]
            theirs = block_keys[k]
            ok = j == jk and j < len(mine) and j < len(theirs) and mine[j] == theirs[j]
            assert ok, (
                f"page {page:#x} is entry {j} of request {i}'s table and entry {jk} of request {k}'s,"
                f" not one prefix block (keys {mine[j:j + 1]} against {theirs[jk:jk + 1]})")
            shared += 1
    return shared


def test_the_disjointness_check_accepts_only_shared_prefix_blocks():
    """The check itself: one prefix block shared is accepted, anything else sharing a page is not."""
    assert shared_pages({1: [5, 6, 7], 2: [5, 8]}, {1: [11, 12], 2: [11, 13]}) == 1
    assert shared_pages({1: [5, 6], 2: [9, HOST | 6]}, {1: [], 2: []}) == 0
    refused = [
        ({1: [5, 6], 2: [5, 8]}, {1: [11], 2: [12]}),    # block 0 of other keys
        ({1: [5, 6], 2: [6, 5]}, {1: [11, 12], 2: [11, 12]}),  # the same page at another index
        ({1: [5, 6], 2: [5, 6]}, {1: [11], 2: [11]}),    # block 1 has no key: a private block
        ({1: [5], 2: [5]}, {1: [], 2: []}),              # no prefix cache: nothing is shared
    ]
    for tables, block_keys in refused:
        with pytest.raises(AssertionError, match="not one prefix block"):
            shared_pages(tables, block_keys)


def test_random_operations_keep_page_tables_disjoint_but_for_shared_prefix_blocks():
    """The state machine, bounded and deterministic; it must have seen shared prefix pages (a run that
    never shares one would not exercise the rule)."""
    SEEN.update(shared=0, steps=0)
    run_state_machine_as_test(RandomOps, settings=settings(
        max_examples=150, stateful_step_count=50, derandomize=True, database=None, deadline=None,
        print_blob=False, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                         HealthCheck.filter_too_much]))
    assert SEEN["steps"] > 1000, SEEN
    assert SEEN["shared"] > 0, SEEN


def test_two_prompts_of_one_prefix_share_its_blocks_and_only_those():
    """The sharing rule, by hand: two requests with the same first two block hashes share exactly those
    two pages once the first one's prompt is computed."""
    s = kvsched.Scheduler(tokens_per_block=4, gpu_pages=32, host_pages=0, max_blocks_per_request=8,
                          max_requests=4, max_num_tokens=64, chunk_unit=0)
    s.submit(1, 12, max_new_tokens=4, hashes=[7, 8, 9])
    s.schedule()
    s.complete_step()
    s.submit(2, 12, max_new_tokens=4, hashes=[7, 8, 5])
    s.schedule()
    a, b = s.page_table(1), s.page_table(2)
    assert a[:2] == b[:2] and not set(a[2:]) & set(b), (a, b)
    root = s.prefix_root(1)
    assert s.prefix_root(2) == root
    assert keys(root, [7, 8]) == keys(s.prefix_root(2), [7, 8])


def test_a_full_request_table_refuses_the_next_submit():
    """Found by the first random run: Scheduler(max_requests=4) took 8 submits, scheduled 0-3 and never
    4-7, and page_table(5) panicked reading past the pool's rows (a PanicException). The core refuses a
    request beyond its pool's rows now (KvLimits::slots): a typed error, nothing changed."""
    s = kvsched.Scheduler(max_requests=4)
    for i in range(4):
        s.submit(i, 64, max_new_tokens=2)
    for i in range(4, 8):
        with pytest.raises(kvsched.CapacityError, match=r"request table is full \(capacity 4\)"):
            s.submit(i, 64, max_new_tokens=2)
    assert len(s) == 4
    with pytest.raises(kvsched.UnknownRequest):
        s.page_table(5)
    out = s.schedule()
    assert sorted(e.id for e in out.context) == [0, 1, 2, 3]
    s.complete_step()
    for i in range(4):
        s.finish(i)
    for i in range(4, 8):
        s.submit(i, 64, max_new_tokens=2)
    out = s.schedule()
    assert sorted(e.id for e in out.context) == [4, 5, 6, 7]
    assert all(len(s.page_table(i)) == 2 for i in range(4, 8))
