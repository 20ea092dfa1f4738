//! Failures peers shipped in kvsched's area (issue 42), each as a behaviour of the whole scheduler on the
//! real page pool (with its prefix cache) and adapter cache, named after the behaviour; the peer's tracker
//! is cited on each test. The batch limit freezing behind skipped requests (vLLM #53130) is
//! `skipped_requests_leave_the_batch_limit_alone` in `core/src/scheduler/admission.rs`.

use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::config::{ChunkPolicy, Chunking};
use kvsched_core::ids::TaskId;
use kvsched_core::output::SchedulerOutput;
use kvsched_core::page_pool::{KvPool, KvPoolConfig, SeqState};
use kvsched_core::request::RequestSpec;
use kvsched_core::scheduler::{Handle, Scheduler};
use kvsched_core::storage::Owned;
use kvsched_core::{Config, Phase};

type Sched = Scheduler<KvPool<'static, Owned>, AdapterPool<8>, 16, 8>;
type Out = SchedulerOutput<16>;

/// A scheduler under `cfg` over `gpu_pages` and `host_pages` of `tpb` tokens, with a prefix cache;
/// adapters 1 to 3 registered.
fn sched(cfg: Config, tpb: u32, gpu_pages: u32, host_pages: u32) -> Sched {
    let pool = KvPool::owned_with_prefix_cache(KvPoolConfig {
        tokens_per_block: tpb,
        gpu_pages,
        host_pages,
        slots: 16,
        max_blocks: 512,
    })
    .unwrap();
    let mut adapters = AdapterPool::new(8, 16).unwrap();
    for t in 1..=3 {
        adapters.register(TaskId(t), 1).unwrap();
    }
    Scheduler::new(cfg, pool, adapters).unwrap()
}

fn id(s: &Sched, h: Handle) -> u64 {
    s.get(h).unwrap().spec().id.0
}

/// One pass and its step; returns the ids of the context chunks and of the recompute-paused requests.
fn step(s: &mut Sched, out: &mut Out) -> (Vec<u64>, Vec<u64>) {
    s.schedule(out).unwrap();
    let chunks = out.context().iter().map(|c| id(s, c.listed.handle()));
    let chunks = chunks.collect();
    let paused = out.recompute_paused().iter().map(|l| id(s, l.handle()));
    let paused = paused.collect();
    s.ensure_batch(out).unwrap();
    let _ = s.take_moves();
    s.complete_step(out).unwrap();
    assert!(s.check());
    let pages = s.kv().config().page_info_len();
    assert!(s.kv().audit(&mut vec![0; pages]), "the pool's audit");
    (chunks, paused)
}

fn prompt(id: u64, tokens: u32) -> RequestSpec {
    let mut r = RequestSpec::new(id, Phase::ContextInit, tokens);
    r.max_new_tokens = 4;
    r
}

/// vLLM #57841: a request that holds many blocks and needs a few more is never stuck behind a waiting
/// one that needs more than is free and holds none. 20 pages free; L holds 250 and needs 5 (its last
/// chunk), H needs 100, W needs 10: L's chunk and W are scheduled in that pass, H once L finishes. A
/// scan that stopped at H would schedule neither and fail the first assertion.
#[test]
fn a_request_holding_many_blocks_is_not_stuck_behind_one_that_does_not_fit() {
    let cfg = Config {
        max_num_tokens: Some(1000),
        max_context_length: Some(1000),
        chunking: Some(Chunking {
            policy: ChunkPolicy::FirstComeFirstServed,
            unit: 4,
        }),
        ..Config::default()
    };
    let mut s = sched(cfg, 4, 270, 0);
    let mut out = Out::new();
    let l = s.submit(prompt(1, 1020)).unwrap();
    assert_eq!(step(&mut s, &mut out).0, [1], "L's first chunk: 250 pages");
    assert_eq!(s.kv().gpu_free(), 20);
    s.submit(prompt(2, 400)).unwrap();
    s.submit(prompt(3, 40)).unwrap();
    assert_eq!(step(&mut s, &mut out).0, [1, 3], "L's last chunk and W");
    s.remove(l).unwrap();
    assert_eq!(step(&mut s, &mut out).0, [2], "H once L finished");
}

/// TensorRT-LLM PR #15931: suspending while the host tier cannot take a request's pages changes
/// nothing it could not undo: the request stays HELD on the GPU with the very same pages, no move is
/// logged and the host tier is untouched (the pool's audit and `check` after every pass). A suspension
/// that moved some pages before the host allocation failed would change the table or the host count;
/// one that failed outright would panic the pass.
#[test]
fn a_suspension_the_host_tier_cannot_take_changes_nothing() {
    let cfg = Config {
        recompute_pause: false,
        ..Config::default()
    };
    // Two pages on the host; each request holds four private pages.
    let mut s = sched(cfg, 16, 8, 2);
    let mut out = Out::new();
    let a = s.submit(prompt(1, 64)).unwrap();
    let b = s.submit(prompt(2, 64)).unwrap();
    step(&mut s, &mut out);
    let table = s.kv().table(b.index()).to_vec();
    assert_eq!(table.len(), 4);
    s.schedule(&mut out).unwrap();
    assert_eq!(
        out.paused().len(),
        2,
        "B for A's decode page, then A: both HELD"
    );
    assert_eq!(s.kv().seq(b.index()).state, SeqState::Suspended);
    assert_eq!(
        s.kv().table(b.index()),
        table,
        "its pages stay where they were"
    );
    assert_eq!(s.kv().host_free(), 2, "the host tier is untouched");
    assert!(s.take_moves().is_empty(), "nothing to copy");
    assert_eq!(s.kv().stats().held_suspends, 2);
    s.ensure_batch(&mut out).unwrap();
    s.complete_step(&out).unwrap();
    assert!(s.check());
    s.remove(a).unwrap();
    step(&mut s, &mut out);
    assert_eq!(s.kv().seq(b.index()).state, SeqState::Active, "B resumes");
    assert_eq!(s.kv().table(b.index())[..4], table[..], "on its own pages");
}

/// 8 pages of 16 tokens: A (64 tokens, 4 pages) and B (48, 3) admitted and decoding, A marked in flight.
fn a_in_flight() -> (Sched, Out, Handle) {
    let mut s = sched(Config::default(), 16, 8, 0);
    let mut out = Out::new();
    let a = s.submit(prompt(1, 64)).unwrap();
    s.submit(prompt(2, 48)).unwrap();
    step(&mut s, &mut out);
    s.set_inflight(a, true).unwrap();
    (s, out, a)
}

/// SGLang PR #18803 (the engine's side): removing a request whose step is in flight is refused and
/// changes nothing, so its pages are not freed while the step may still read them, and the next pass
/// cannot hand them to a newcomer; once its mark is cleared (the step completed) it is removed and they
/// can. Before, the removal freed the pages at once and C, submitted next, was scheduled on A's pages.
#[test]
fn a_request_in_flight_is_not_removed_before_its_step_completes() {
    let (mut s, mut out, a) = a_in_flight();
    let (before, table) = (s.fingerprint(), s.kv().table(a.index()).to_vec());
    assert!(matches!(s.remove(a), Err(kvsched_core::Error::Invalid(_))));
    assert_eq!(s.fingerprint(), before, "a refused removal changes nothing");
    let c = s.submit(prompt(3, 64)).unwrap();
    step(&mut s, &mut out);
    assert_eq!(s.kv().table(a.index()), table, "A's pages stay A's");
    assert!(s.kv().table(c.index()).iter().all(|p| !table.contains(p)));
    s.set_inflight(a, false).unwrap();
    s.remove(a).unwrap();
    assert_eq!(step(&mut s, &mut out).0, [3], "then C gets them");
}

/// SGLang PR #18803 (the part kvsched decides): a request whose step is in flight is never a victim,
/// so the pass never hands its pages to another request. A, in flight, and B fill the pool; B's decode
/// takes the last free page and, the pool full, the pass evicts nobody: A keeps its pages and stays
/// active. A pass that took A's pages (suspension, recompute pause) would change A's table or state.
#[test]
fn an_in_flight_requests_pages_are_never_taken_by_the_pass() {
    let (mut s, mut out, a) = a_in_flight();
    let table = s.kv().table(a.index()).to_vec();
    for _ in 0..3 {
        let (chunks, paused) = step(&mut s, &mut out);
        assert!(chunks.is_empty() && paused.is_empty() && out.paused().is_empty());
        assert_eq!(s.kv().seq(a.index()).state, SeqState::Active);
        assert_eq!(s.kv().table(a.index()), table);
    }
}

/// vLLM #41951: a recompute-paused request keeps its place ahead of requests that arrived after it,
/// and is not paused again for them. 1 is paused for 0's growth; 2 and 3 arrive; 0 finishes. Only one of
/// 1, 2 and 3 fits: 1 is replayed, then decodes to its end while 2 and 3 wait. Were the paused request
/// queued behind later arrivals, 2 would be scheduled first (the first assertion fails); were it a
/// victim for them, the loop's assertion fails.
#[test]
fn a_paused_request_keeps_its_place_ahead_of_later_arrivals() {
    let mut s = sched(Config::default(), 16, 10, 0);
    let mut out = Out::new();
    let mut long = prompt(0, 64);
    long.max_new_tokens = 40;
    let a = s.submit(long).unwrap();
    step(&mut s, &mut out);
    let mut r1 = prompt(1, 80);
    r1.max_new_tokens = 40;
    let paused = s.submit(r1).unwrap();
    assert_eq!(step(&mut s, &mut out).0, [1]);
    assert!(
        (0..40).any(|_| step(&mut s, &mut out).1.contains(&1)),
        "1 paused"
    );
    s.submit(prompt(2, 96)).unwrap();
    s.submit(prompt(3, 96)).unwrap();
    s.remove(a).unwrap();
    assert_eq!(step(&mut s, &mut out).0, [1], "1 first, alone");
    for _ in 0..3 {
        let (chunks, paused_now) = step(&mut s, &mut out);
        assert!(chunks.is_empty() && paused_now.is_empty(), "1 decodes on");
    }
    s.remove(paused).unwrap();
    assert_eq!(step(&mut s, &mut out).0, [2]);
}

/// vLLM #44701: no two prefix keys share a root — an adapter id and a cache salt of the same value,
/// swapped, or either against the base model. Every combination of adapter (none, 1, 2) and salt (0, 1,
/// 2) computes the same prompt from scratch; only the same combination again reuses it. A root that
/// mixed the keys symmetrically (`lora ^ salt`, `lora + salt`) would let (1, 2) reuse (2, 1).
#[test]
fn no_two_prefix_keys_share_a_root() {
    let mut s = sched(Config::default(), 16, 128, 0);
    let mut out = Out::new();
    let h: Vec<u64> = (0..6).collect();
    let mut id = 0;
    let mut run = |s: &mut Sched, lora: Option<u64>, salt: u64| {
        id += 1;
        let mut spec = prompt(id, 100);
        spec.lora = lora.map(TaskId);
        let r = s.submit_with_prefix(spec, salt, &h).unwrap();
        let (chunks, _) = step(s, &mut out);
        assert_eq!(chunks, [id]);
        let reused = out.context()[0].tokens < 100;
        s.remove(r).unwrap();
        reused
    };
    for lora in [None, Some(1), Some(2)] {
        for salt in 0..3 {
            assert!(!run(&mut s, lora, salt), "{lora:?} {salt}: computed");
        }
    }
    assert!(run(&mut s, Some(1), 2), "the same keys reuse");
    assert!(run(&mut s, None, 0));
}
