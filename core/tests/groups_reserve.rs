//! GUARANTEED_NO_EVICT on KV groups (`kv_groups/reserve.rs`): each group reserves what the request
//! will hold there at most at once — the full group its whole length, a window group its window and
//! one step — counted against the pool's pages, not grown to; capacities stay the tokens computed, so
//! the window gives up the right pages; a reserved request is never refused a step; a reservation
//! that does not fit waits, and closes admissions.

use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::config::{ChunkPolicy, Chunking};
use kvsched_core::kv::{CacheState, KvBackend, KvLimits, KvRef, PageMove};
use kvsched_core::kv_groups::{Attention, Group, KvGroups};
use kvsched_core::output::SchedulerOutput;
use kvsched_core::page_pool::{KvPool, KvPoolConfig, NO_PAGE};
use kvsched_core::request::RequestSpec;
use kvsched_core::scheduler::{Handle, Scheduler};
use kvsched_core::storage::Owned;
use kvsched_core::{Config, Error, Phase, RequestId};

type Groups = KvGroups<'static, Owned, 2>;
type Sched = Scheduler<Groups, AdapterPool<4>, 8, 4>;

const TPB: u32 = 16;
const WINDOW: u32 = 64;

fn pool(gpu_pages: u32) -> KvPool<'static, Owned> {
    KvPool::owned(KvPoolConfig {
        tokens_per_block: TPB,
        gpu_pages,
        host_pages: 0,
        slots: 8,
        max_blocks: 64,
    })
    .unwrap()
}

fn scheduler(full: u32, window: u32, chunk: Option<u32>) -> Sched {
    let groups = KvGroups::new([
        Group {
            attention: Attention::Full,
            pool: pool(full),
        },
        Group {
            attention: Attention::Sliding { window: WINDOW },
            pool: pool(window),
        },
    ])
    .unwrap();
    let cfg = Config {
        policy: kvsched_core::config::CapacityPolicy::GuaranteedNoEvict,
        chunking: chunk.map(|unit| Chunking {
            policy: ChunkPolicy::FirstComeFirstServed,
            unit,
        }),
        max_num_tokens: chunk.or(Config::default().max_num_tokens),
        ..Config::default()
    };
    Scheduler::new(cfg, groups, AdapterPool::new(4, 8).unwrap()).unwrap()
}

fn submit(s: &mut Sched, id: u64, prompt: u32, out: u32) -> Handle {
    let mut spec = RequestSpec::new(id, Phase::ContextInit, prompt);
    spec.max_new_tokens = out;
    s.submit(spec).unwrap()
}

/// One pass and its step; every invariant (the groups' claims included) after it. Returns the
/// requests that ran, by slot.
fn pass(s: &mut Sched, out: &mut SchedulerOutput<8>) -> Vec<u16> {
    s.schedule(out).unwrap();
    s.ensure_batch(out).unwrap();
    let _ = s.take_moves();
    let _ = s.take_group_moves(1);
    s.complete_step(out).unwrap();
    assert!(s.check() && s.kv().check());
    let mut ran: Vec<u16> = out.context().iter().map(|c| c.listed.slot()).collect();
    ran.extend(out.generation().iter().map(|g| g.slot()));
    ran
}

/// Pages group `g` holds for `slot`.
fn held(s: &Sched, g: usize, slot: u16) -> u32 {
    let t = s.kv().groups()[g].pool.table(slot);
    t.iter().filter(|&&e| e != NO_PAGE).count() as u32
}

/// A 100-token prompt in 32-token chunks with 200 output tokens: its full group reserves 300 tokens'
/// 19 pages; its window group, after the first chunk's 2 pages, what a later chunk's queries read
/// (the window's 63 tokens before a query and a 32-token chunk: 6 pages) and one for the alignment:
/// 7. Seven window pages admit it, and it runs every step to completion within them; six never admit
/// it, although its first chunk needs 2 (it waits, nothing runs).
#[test]
fn a_window_group_reserves_its_window_and_a_step_not_the_request() {
    let mut s = scheduler(19, 7, Some(32));
    let mut out = SchedulerOutput::<8>::new();
    let h = submit(&mut s, 1, 100, 200);
    assert!(s.kv().limits().reserves);
    let mut computed = 0;
    for step in 0..204 {
        assert_eq!(pass(&mut s, &mut out), vec![h.index()], "step {step}");
        computed = if step < 4 {
            (32 * (step + 1)).min(100)
        } else {
            computed + 1
        };
        // The capacity is the tokens computed, in both groups (not the reservation).
        let capacity = s.kv().groups()[1].pool.seq(h.index()).capacity;
        assert_eq!(capacity, computed, "step {step}");
        assert_eq!(s.kv().groups()[0].pool.seq(h.index()).capacity, capacity);
        assert!(held(&s, 1, h.index()) <= 7, "step {step}");
    }
    assert_eq!(held(&s, 0, h.index()), 300u32.div_ceil(TPB));
    s.remove(h).unwrap();

    let mut s = scheduler(19, 6, Some(32));
    let h = submit(&mut s, 1, 100, 200);
    for _ in 0..3 {
        assert!(pass(&mut s, &mut out).is_empty());
    }
    let r = KvRef {
        slot: h.index(),
        id: RequestId(1),
    };
    assert_eq!(s.kv().cache(r), CacheState::NoCache);
}

/// Two requests of 64 + 128 tokens reserve 12 full-group pages each, which 24 pages cover; a third of
/// 16 + 16 tokens (2 pages) waits although the pool has 16 free pages (the first two hold 4 each),
/// and runs once one of them is gone. Each of the first two is never refused a step meanwhile.
#[test]
fn a_reservation_holds_pages_its_request_has_not_taken_yet() {
    let mut s = scheduler(24, 64, None);
    let mut out = SchedulerOutput::<8>::new();
    let a = submit(&mut s, 1, 64, 128);
    let b = submit(&mut s, 2, 64, 128);
    let c = submit(&mut s, 3, 16, 16);
    let mut ran = pass(&mut s, &mut out);
    ran.sort_unstable();
    assert_eq!(ran, vec![a.index(), b.index()]);
    assert_eq!(s.kv().groups()[0].pool.gpu_free(), 24 - 4 - 4);
    for step in 1..128 {
        let mut ran = pass(&mut s, &mut out);
        ran.sort_unstable();
        assert_eq!(ran, vec![a.index(), b.index()], "step {step}: c waits");
    }
    s.remove(a).unwrap();
    let ran = pass(&mut s, &mut out);
    assert!(
        ran.contains(&c.index()) && ran.contains(&b.index()),
        "{ran:?}"
    );
}

/// A backend with sliding windows that reserves only by capacity: GUARANTEED_NO_EVICT over it would
/// give up pages its next queries read, and the scheduler refuses it; KV groups reserve in pages and
/// are accepted (`scheduler` above).
#[test]
fn guaranteed_no_evict_over_windows_that_reserve_by_capacity_is_refused() {
    struct ByCapacity;
    impl KvBackend for ByCapacity {
        type Draft = kvsched_core::kv::Absent;
        type Cross = kvsched_core::kv::Absent;
        type Transfers = kvsched_core::kv::Absent;
        type Prefix = kvsched_core::kv::Absent;
        type Adapters = kvsched_core::kv::Absent;
        fn limits(&self) -> KvLimits {
            KvLimits {
                tier_below_gpu: false,
                can_evict: false,
                max_tokens_per_request: 1 << 20,
                slots: u32::MAX,
                sliding_windows: true,
                reserves: false,
            }
        }
        fn cache(&self, _: KvRef) -> CacheState {
            CacheState::NoCache
        }
        fn prepare_context(&mut self, _: KvRef, _: kvsched_core::kv::ContextPrep) -> Option<u32> {
            None
        }
        fn prepare_disagg_gen_init(&mut self, _: KvRef, _: u32) -> bool {
            false
        }
        fn resize_context(&mut self, _: KvRef, _: u32, _: bool) -> bool {
            false
        }
        fn try_allocate_generation(&mut self, _: KvRef, _: u32) -> bool {
            false
        }
        fn revert_allocate_generation(&mut self, _: KvRef) {}
        fn rewind(&mut self, _: KvRef, _: u32) {}
        fn suspend(&mut self, _: KvRef) {}
        fn free(&mut self, _: KvRef) {}
        fn preempt(&mut self, _: KvRef) {}
        fn take_moves(&mut self) -> &[PageMove] {
            &[]
        }
    }
    let cfg = Config {
        policy: kvsched_core::config::CapacityPolicy::GuaranteedNoEvict,
        ..Config::default()
    };
    let got: Result<Scheduler<ByCapacity, AdapterPool<4>, 8, 4>, Error> =
        Scheduler::new(cfg, ByCapacity, AdapterPool::new(4, 8).unwrap());
    match got {
        Err(Error::Invalid(why)) => assert!(why.contains("GUARANTEED_NO_EVICT"), "{why}"),
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("accepted"),
    }
    let max_utilization: Result<Scheduler<ByCapacity, AdapterPool<4>, 8, 4>, Error> =
        Scheduler::new(
            Config::default(),
            ByCapacity,
            AdapterPool::new(4, 8).unwrap(),
        );
    assert!(max_utilization.is_ok());
}
