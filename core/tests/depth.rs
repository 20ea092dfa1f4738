//! The pass at depth (issue 41): a queue that builds up behind a full pool is not re-matched or
//! revisited pass after pass. A waiting first chunk's trial refuses it without taking a block
//! (difference 15), and the refused run that ends phase 2 is skipped by the next pass while nothing it
//! depends on changed — exactly: every pass here is compared with a twin whose passes are all full
//! ones and visit every request (`set_incremental(false)`).

use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::output::SchedulerOutput;
use kvsched_core::page_pool::{KvPool, KvPoolConfig};
use kvsched_core::request::RequestSpec;
use kvsched_core::scheduler::{Handle, Scheduler};
use kvsched_core::storage::Owned;
use kvsched_core::{Config, Phase};

type Sched = Scheduler<KvPool<'static, Owned>, AdapterPool<4>, 32, 4>;
type Out = SchedulerOutput<32>;

/// A scheduler and its full-pass twin, given the same operations.
struct Twins {
    s: Sched,
    full: Sched,
    out: Out,
    full_out: Out,
}

/// 16 GPU pages of 16 tokens, a host tier, a prefix cache; whole prompts (no chunking).
fn sched(incremental: bool) -> Sched {
    let cfg = KvPoolConfig {
        tokens_per_block: 16,
        gpu_pages: 16,
        host_pages: 64,
        slots: 32,
        max_blocks: 16,
    };
    let pool = KvPool::owned_with_prefix_cache(cfg).unwrap();
    let mut s = Scheduler::new(Config::default(), pool, AdapterPool::new(4, 4).unwrap()).unwrap();
    s.set_incremental(incremental);
    s
}

impl Twins {
    fn new() -> Self {
        Self {
            s: sched(true),
            full: sched(false),
            out: Out::new(),
            full_out: Out::new(),
        }
    }

    /// Submits a `prompt`-token request whose blocks hash by `family` to both.
    fn submit(&mut self, id: u64, prompt: u32, family: u64) -> Handle {
        let hashes: Vec<u64> = (0..u64::from(prompt / 16))
            .map(|k| family * 1000 + k)
            .collect();
        let spec = RequestSpec::new(id, Phase::ContextInit, prompt);
        let h = self.s.submit_with_prefix(spec.clone(), 0, &hashes).unwrap();
        assert_eq!(h, self.full.submit_with_prefix(spec, 0, &hashes).unwrap());
        h
    }

    /// One pass and its step on both; the two agree on the output and the state. Returns the pass's
    /// skipped requests and the ids of the context chunks it scheduled.
    fn pass(&mut self) -> (u32, Vec<u64>) {
        self.s.schedule(&mut self.out).unwrap();
        self.full.schedule(&mut self.full_out).unwrap();
        assert_eq!(self.out.context(), self.full_out.context());
        assert_eq!(self.out.generation(), self.full_out.generation());
        assert_eq!(self.out.paused(), self.full_out.paused());
        assert_eq!(
            self.full.last_pass().skipped,
            0,
            "a full pass visits every request"
        );
        let ids = self.out.context().iter();
        let ids = ids.map(|c| self.s.get(c.listed.handle()).unwrap().spec().id.0);
        let scheduled = ids.collect();
        for (s, out) in [(&mut self.s, &self.out), (&mut self.full, &self.full_out)] {
            let _ = s.take_moves();
            s.complete_step(out).unwrap();
            assert!(s.check());
        }
        assert_eq!(self.s.fingerprint(), self.full.fingerprint());
        assert_eq!(self.s.kv().fingerprint(), self.full.kv().fingerprint());
        (self.s.last_pass().skipped, scheduled)
    }

    fn remove(&mut self, h: Handle) {
        self.s.remove(h).unwrap();
        self.full.remove(h).unwrap();
    }
}

#[test]
fn a_queue_behind_a_full_pool_is_skipped_until_enough_changed_to_admit_one() {
    let mut t = Twins::new();
    // Two running requests take 14 of the 16 pages (7 each, with a decode page each to come).
    let a = t.submit(1, 100, 1);
    let b = t.submit(2, 100, 2);
    assert_eq!(t.pass().1, [1, 2]);
    // Ten prompts of 200 tokens (13 pages each) wait behind them: none fits.
    for id in 10..20 {
        t.submit(id, 200, id);
    }
    assert_eq!(t.pass(), (0, vec![]), "the first pass tries every one");
    assert_eq!(
        t.pass(),
        (10, vec![]),
        "the next skips the run its trials refused"
    );
    // An arrival joins after the run: only it is tried.
    t.submit(20, 200, 20);
    assert_eq!(t.pass(), (10, vec![]));
    assert_eq!(t.pass(), (11, vec![]));
    // A removal frees 8 pages: each member was short of 11 or more, so none can fit and the run is
    // still skipped.
    t.remove(a);
    assert_eq!(t.pass(), (11, vec![]));
    assert_eq!(t.pass(), (11, vec![]));
    // The other frees the rest: the first waiting prompt fits, and the ten behind it, each short of
    // more pages than are left, are skipped.
    t.remove(b);
    assert_eq!(t.pass(), (10, vec![10]));
}

#[test]
fn a_run_is_not_skipped_once_pages_come_free_or_its_prefix_is_cached() {
    let mut t = Twins::new();
    let a = t.submit(1, 100, 1);
    let b = t.submit(2, 100, 2);
    t.pass();
    // A prompt sharing request 1's six blocks, and one that shares nothing.
    t.submit(10, 200, 1);
    t.submit(11, 200, 11);
    assert_eq!(t.pass(), (0, vec![]));
    assert_eq!(t.pass(), (2, vec![]));
    // Request 2 finishes: its pages come free (the pool's available pages grow by more than request
    // 10 was short of), so request 10 is tried again and fits (reusing request 1's blocks); request
    // 11, short of more than the pages left, is still skipped.
    t.remove(b);
    let (skipped, scheduled) = t.pass();
    assert_eq!((skipped, scheduled), (1, vec![10]));
    t.remove(a);
    for _ in 0..3 {
        t.pass();
    }
}
