//! KV-cache groups (`kv_groups`): a full-attention group and a sliding-window group as one backend.
//! Bad configurations are refused; a long request's window group stays within its window's pages
//! through the whole scheduler; every operation acts on both groups, all or nothing; suspension and
//! resumption move both groups' pages.

use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::kv::{ContextPrep, KvBackend, KvRef};
use kvsched_core::kv_groups::{Attention, Group, KvGroups};
use kvsched_core::output::SchedulerOutput;
use kvsched_core::page_pool::{KvPool, KvPoolConfig, NO_PAGE};
use kvsched_core::request::RequestSpec;
use kvsched_core::scheduler::Scheduler;
use kvsched_core::storage::Owned;
use kvsched_core::{Config, Error, Phase, RequestId};

type Groups = KvGroups<'static, Owned, 2>;

const TPB: u32 = 16;
const WINDOW: u32 = 64;

fn cfg(gpu_pages: u32, host_pages: u32) -> KvPoolConfig {
    KvPoolConfig {
        tokens_per_block: TPB,
        gpu_pages,
        host_pages,
        slots: 8,
        max_blocks: 64,
    }
}

fn pool(c: KvPoolConfig, prefix: bool) -> KvPool<'static, Owned> {
    if prefix {
        KvPool::owned_with_prefix_cache(c).unwrap()
    } else {
        KvPool::owned(c).unwrap()
    }
}

/// A full group of `full` GPU pages and a window group of `window` (each with `host` host pages).
fn groups(full: u32, window: u32, host: u32) -> Groups {
    KvGroups::new([
        Group {
            attention: Attention::Full,
            pool: pool(cfg(full, host), false),
        },
        Group {
            attention: Attention::Sliding { window: WINDOW },
            pool: pool(cfg(window, host), false),
        },
    ])
    .unwrap()
}

fn r(slot: u16) -> KvRef {
    KvRef {
        slot,
        id: RequestId(u64::from(slot) + 10),
    }
}

/// Pages group `g` holds for slot `slot` (its table less the released entries).
fn held(k: &Groups, g: usize, slot: u16) -> usize {
    k.groups()[g]
        .pool
        .table(slot)
        .iter()
        .filter(|&&e| e != NO_PAGE)
        .count()
}

#[test]
fn bad_group_lists_are_refused() {
    let g = |attention, c| Group {
        attention,
        pool: pool(c, false),
    };
    let sliding = |window| Attention::Sliding { window };
    let cases: Vec<(Result<Groups, Error>, &str)> = vec![
        (
            KvGroups::new([g(sliding(64), cfg(8, 0)), g(Attention::Full, cfg(8, 0))]),
            "first KV group must be full",
        ),
        (
            KvGroups::new([g(Attention::Full, cfg(8, 0)), g(sliding(0), cfg(8, 0))]),
            "at least one position",
        ),
        (
            KvGroups::new([
                g(Attention::Full, cfg(8, 0)),
                g(sliding(64 * 16 + 16), cfg(8, 0)),
            ]),
            "at most a request",
        ),
        (
            KvGroups::new([g(Attention::Full, cfg(8, 0)), g(sliding(40), cfg(8, 0))]),
            "whole number of pages",
        ),
        (
            KvGroups::new([
                g(Attention::Full, cfg(8, 0)),
                g(
                    sliding(64),
                    KvPoolConfig {
                        slots: 4,
                        ..cfg(8, 0)
                    },
                ),
            ]),
            "same slots",
        ),
        (
            KvGroups::new([
                g(Attention::Full, cfg(8, 0)),
                Group {
                    attention: sliding(64),
                    pool: pool(cfg(8, 0), true),
                },
            ]),
            "every pool or in none",
        ),
    ];
    for (got, words) in cases {
        match got {
            Err(Error::Invalid(why)) => assert!(why.contains(words), "{why:?} vs {words:?}"),
            other => panic!("{words}: {other:?}"),
        }
    }
}

#[test]
fn a_long_request_holds_its_window_in_the_window_group_through_the_scheduler() {
    let adapters = AdapterPool::new(4, 8).unwrap();
    let mut s: Scheduler<Groups, AdapterPool<4>, 8, 4> =
        Scheduler::new(Config::default(), groups(64, 8, 0), adapters).unwrap();
    let mut out = SchedulerOutput::<8>::new();
    let mut spec = RequestSpec::new(1, Phase::ContextInit, 100);
    spec.max_new_tokens = 800;
    let h = s.submit(spec).unwrap();
    // A decode step's query reads the window before it: W / page + 1 pages (the prompt's chunk held
    // its own windows, 7 pages, until the first decode step).
    let bound = (WINDOW / TPB + 1) as usize;
    for step in 0..600 {
        s.schedule(&mut out).unwrap();
        s.ensure_batch(&mut out).unwrap();
        let _ = s.take_moves();
        assert!(s.take_group_moves(1).is_empty());
        s.complete_step(&out).unwrap();
        assert!(s.check() && s.kv().check(), "step {step}");
        let tokens = s.kv().groups()[0].pool.seq(0).capacity;
        assert_eq!(held(s.kv(), 0, 0), tokens.div_ceil(TPB) as usize);
        let window = held(s.kv(), 1, 0);
        assert!(step == 0 || window <= bound, "step {step}: {window} pages");
    }
    assert_eq!(s.kv().groups()[0].pool.seq(0).capacity, 100 + 599);
    assert_eq!(held(s.kv(), 0, 0), 44, "the full group holds every block");
    assert_eq!(
        s.kv().groups()[1].pool.gpu_free(),
        8 - held(s.kv(), 1, 0) as u32
    );
    s.remove(h).unwrap();
    let g = s.kv().groups();
    assert_eq!((g[0].pool.gpu_free(), g[1].pool.gpu_free()), (64, 8));
}

#[test]
fn a_growth_one_group_refuses_changes_neither() {
    // The window group has 4 pages: a 100-token prompt needs 7.
    let mut k = groups(64, 4, 0);
    assert_eq!(k.prepare_context(r(0), ContextPrep::first(100)), Some(0));
    let before = k.groups()[0].pool.fingerprint();
    assert!(!k.resize_context(r(0), 100, true));
    assert!(
        !k.cache(r(0)).is_active(),
        "a refused first chunk is inactive"
    );
    assert_eq!(k.groups()[0].pool.gpu_free(), 64);
    assert_ne!(k.groups()[0].pool.fingerprint(), before, "suspended");
    // A decode step the window group cannot take leaves the full group's capacity as it was.
    let mut k = groups(64, 5, 0);
    k.prepare_context(r(1), ContextPrep::first(64)).unwrap();
    assert!(k.resize_context(r(1), 64, true));
    // Fill the window group: one more page is left, taken by request 2.
    k.prepare_context(r(2), ContextPrep::first(16)).unwrap();
    assert!(k.resize_context(r(2), 16, true));
    assert_eq!(k.groups()[1].pool.gpu_free(), 0);
    let (table, free) = (
        k.groups()[0].pool.table(1).to_vec(),
        k.groups()[0].pool.gpu_free(),
    );
    assert!(
        !k.try_allocate_generation(r(1), 1),
        "a new page in both groups"
    );
    let full = &k.groups()[0].pool;
    assert_eq!(
        (full.seq(1).capacity, full.table(1), full.gpu_free()),
        (64, &table[..], free)
    );
    assert!(k.check());
}

#[test]
fn suspension_and_resumption_move_both_groups() {
    let mut k = groups(64, 8, 16);
    k.prepare_context(r(0), ContextPrep::first(100)).unwrap();
    assert!(k.resize_context(r(0), 100, true));
    assert!(k.try_allocate_generation(r(0), 1));
    // Block 0 and 1 lie wholly before position 100 − 64 + 1.
    assert_eq!((held(&k, 0, 0), held(&k, 1, 0)), (7, 5));
    k.suspend(r(0));
    assert_eq!(k.take_moves().len(), 7);
    assert_eq!(k.take_group_moves(1).len(), 5);
    assert!(k.try_allocate_generation(r(0), 1));
    assert_eq!(k.take_moves().len(), 7);
    assert_eq!(k.take_group_moves(1).len(), 5);
    assert!(k.check());
    k.free(r(0));
    let g = k.groups();
    assert_eq!((g[0].pool.gpu_free(), g[1].pool.gpu_free()), (64, 8));
}

/// A reservation (GUARANTEED_NO_EVICT's, at the backend: the scheduler refuses the policy over
/// sliding windows) resizes the first chunk to the whole request; a later chunk then resizes to the
/// capacity it already has, and a decode step inside the reservation asks for no new token
/// (`try_allocate_generation(r, 0)`). Both took the reserved capacity for the first new position and
/// released the blocks the step's own queries read: the chunk at 32 reads from block 0, the decode
/// step at 100 from 2, and 14 blocks were gone. A chunk's window is now released at its prepared
/// position and a step of no token releases nothing. Found by the grouped model tests.
#[test]
fn regression_a_reservation_keeps_the_window_its_queries_read() {
    let mut k = groups(64, 32, 0);
    let prep = |position| ContextPrep {
        first_chunk: position == 0,
        position,
        ..ContextPrep::first(100)
    };
    // A 100-token prompt with 200 output tokens reserved: 19 pages in each group.
    assert_eq!(k.prepare_context(r(0), prep(0)), Some(0));
    assert!(k.resize_context(r(0), 300, true), "the first chunk, 0..32");
    assert_eq!(k.prepare_context(r(0), prep(32)), Some(0));
    assert!(k.resize_context(r(0), 300, false), "the chunk 32..64");
    // Its queries read from position 32 + 1 − 64: nothing may be released yet.
    assert_eq!(k.groups()[1].pool.seq(0).released, 0, "a chunk's window");
    assert_eq!(k.prepare_context(r(0), prep(64)), Some(0));
    assert!(k.resize_context(r(0), 300, false), "the chunk 64..100");
    // The first decode step writes position 100: its query reads from 37, in block 2.
    assert!(k.try_allocate_generation(r(0), 0));
    assert!(
        k.groups()[1].pool.seq(0).released <= 2,
        "a decode step's window"
    );
    assert!(k.check());
}

/// A later chunk whose resize the pass rolls back (its resumption's lease was refused: the cache is
/// suspended again) keeps its growth, so the cache holds more than the chunk's position. The next
/// attempt at the chunk grows from that capacity, which the window rule takes for the first new
/// position: it released 4 blocks the chunk's queries read (they read from position 1).
/// `ContextPrep::position` says where the chunk starts, and the window is now released there. Found
/// by the grouped model tests at 20,000 cases (a LoRA request suspended mid-prefill, its lease
/// refused on resumption).
#[test]
fn regression_a_rolled_back_chunk_keeps_the_window_its_next_attempt_reads() {
    let mut k = groups(64, 16, 16);
    let prep = |position| ContextPrep {
        first_chunk: position == 0,
        position,
        ..ContextPrep::first(200)
    };
    assert_eq!(k.prepare_context(r(0), prep(0)), Some(0));
    assert!(k.resize_context(r(0), 64, true), "the first chunk, 0..64");
    k.suspend(r(0));
    // The chunk 64..128, resumed and grown, then rolled back: suspended again, its growth kept.
    assert_eq!(k.prepare_context(r(0), prep(64)), Some(0));
    assert!(k.resize_context(r(0), 128, false));
    k.suspend(r(0));
    // The next attempt: its queries read from 64 + 1 − 64.
    assert_eq!(k.prepare_context(r(0), prep(64)), Some(0));
    assert!(k.resize_context(r(0), 128, false));
    assert_eq!(k.groups()[1].pool.seq(0).released, 0, "the chunk's window");
    assert!(k.check());
}

mod random {
    //! Random operation sequences on the backend, and random workloads through the scheduler: the
    //! groups always agree (every slot's cache state and capacity the same in both, so no operation
    //! left one group changed without the other), each pool's invariants hold, a window group never
    //! holds more than its window needs after a decode step, and everything comes back at the end.
    //! `KVSCHED_PROPTEST_CASES` sets the cases (default 64).

    use super::*;
    use proptest::prelude::*;

    fn cases() -> u32 {
        std::env::var("KVSCHED_PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(64)
    }

    #[derive(Debug, Clone, Copy)]
    enum Op {
        Prepare(u16, u32),
        Resize(u16, u32, bool),
        Allocate(u16, u32),
        Revert(u16),
        Rewind(u16, u32),
        Suspend(u16),
        Free(u16),
        Preempt(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        let slot = 0u16..4;
        prop_oneof![
            1 => (slot.clone(), 1u32..300).prop_map(|(s, p)| Op::Prepare(s, p)),
            3 => (slot.clone(), 1u32..200, any::<bool>()).prop_map(|(s, t, f)| Op::Resize(s, t, f)),
            4 => (slot.clone(), 1u32..4).prop_map(|(s, g)| Op::Allocate(s, g)),
            1 => (slot.clone()).prop_map(Op::Revert),
            1 => (slot.clone(), 1u32..3).prop_map(|(s, t)| Op::Rewind(s, t)),
            1 => (slot.clone()).prop_map(Op::Suspend),
            1 => (slot.clone()).prop_map(Op::Free),
            1 => (slot).prop_map(Op::Preempt),
        ]
    }

    fn apply(k: &mut Groups, op: Op) {
        match op {
            Op::Prepare(s, p) => {
                let _ = k.prepare_context(r(s), ContextPrep::first(p));
            }
            Op::Resize(s, t, first) => {
                let cap = k.groups()[0].pool.seq(s).capacity + t;
                let _ = k.resize_context(r(s), cap, first);
            }
            Op::Allocate(s, g) => {
                let _ = k.try_allocate_generation(r(s), g);
            }
            Op::Revert(s) => k.revert_allocate_generation(r(s)),
            Op::Rewind(s, t) => k.rewind(r(s), t),
            Op::Suspend(s) => k.suspend(r(s)),
            Op::Free(s) => k.free(r(s)),
            Op::Preempt(s) => k.preempt(r(s)),
        }
        let _ = k.take_moves();
        let _ = k.take_group_moves(1);
    }

    /// The groups agree on every slot, and each pool's invariants hold.
    fn agree(k: &Groups) -> Result<(), TestCaseError> {
        prop_assert!(k.check(), "a pool's invariants");
        let [full, window] = k.groups();
        for s in 0..8u16 {
            prop_assert_eq!(full.pool.cache(r(s)), window.pool.cache(r(s)), "slot {}", s);
            prop_assert_eq!(
                full.pool.seq(s).capacity,
                window.pool.seq(s).capacity,
                "slot {}",
                s
            );
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn the_groups_agree_after_every_operation(
            full in 4u32..40,
            window in 5u32..16,
            host in prop::bool::ANY,
            ops in prop::collection::vec(op(), 1..200),
        ) {
            let mut k = groups(full, window, if host { 16 } else { 0 });
            for op in ops {
                apply(&mut k, op);
                agree(&k).map_err(|e| TestCaseError::fail(format!("after {op:?}: {e}")))?;
            }
            for s in 0..4 {
                k.free(r(s));
            }
            let [f, w] = k.groups();
            prop_assert_eq!((f.pool.gpu_free(), w.pool.gpu_free()), (full, window));
        }

        #[test]
        fn random_workloads_run_with_the_window_held(
            window_pages in 7u32..16,
            prompts in prop::collection::vec((1u32..120, 1u32..300), 1..6),
            budget in 64u32..512,
        ) {
            let adapters = AdapterPool::new(4, 8).unwrap();
            let cfg = Config { max_num_tokens: Some(budget), ..Config::default() };
            let mut s: Scheduler<Groups, AdapterPool<4>, 8, 4> =
                Scheduler::new(cfg, groups(64, window_pages, 0), adapters).unwrap();
            let mut out = SchedulerOutput::<8>::new();
            let mut handles = Vec::new();
            for (i, &(prompt, out_len)) in prompts.iter().enumerate() {
                let mut spec = RequestSpec::new(i as u64, Phase::ContextInit, prompt.min(budget));
                spec.max_new_tokens = out_len;
                handles.push((s.submit(spec).unwrap(), prompt.min(budget) + out_len));
            }
            for _ in 0..1500 {
                if handles.is_empty() {
                    break;
                }
                match s.schedule(&mut out) {
                    Ok(()) => {}
                    Err(Error::Deadlock { .. }) => break,
                    Err(e) => return Err(TestCaseError::fail(format!("{e:?}"))),
                }
                s.ensure_batch(&mut out).unwrap();
                let _ = s.take_moves();
                let _ = s.take_group_moves(1);
                s.complete_step(&out).unwrap();
                prop_assert!(s.check() && s.kv().check());
                agree(s.kv())?;
                // A decoding request's window group holds its window and the page being written.
                for g in out.generation() {
                    let slot = g.slot();
                    prop_assert!(held(s.kv(), 1, slot) <= (WINDOW / TPB + 1) as usize);
                }
                // Finished requests leave (the engine's part).
                handles.retain(|&(h, total)| {
                    let done = s.kv().groups()[0].pool.seq(h.index()).capacity >= total;
                    if done {
                        s.remove(h).unwrap();
                    }
                    !done
                });
            }
            for (h, _) in handles {
                s.remove(h).unwrap();
            }
            let g = s.kv().groups();
            prop_assert_eq!((g[0].pool.gpu_free(), g[1].pool.gpu_free()), (64, window_pages));
        }
    }
}

/// Gemma 3 270M's geometry: 18 layers (every sixth global), one KV head of 256, a 512-token window;
/// f32 K and V, as kvsched-engine keeps them.
const GEMMA_LAYERS: u64 = 18;
const GEMMA_GLOBAL: u64 = 3;
const GEMMA_KV_BYTES_PER_LAYER: u64 = 2 * 256 * 4;

/// One request of `len` prompt tokens prefilled in 512-token chunks, then 8 decode steps, on pools of
/// 16-token pages with a 512-token window: the pages it holds in each group.
fn pages_held(len: u32) -> (usize, usize) {
    let blocks = len.div_ceil(16) + 8;
    let c = |gpu_pages| KvPoolConfig {
        tokens_per_block: 16,
        gpu_pages,
        host_pages: 0,
        slots: 2,
        max_blocks: blocks,
    };
    let k = KvGroups::new([
        Group {
            attention: Attention::Full,
            pool: KvPool::owned(c(blocks)).unwrap(),
        },
        Group {
            attention: Attention::Sliding { window: 512 },
            pool: KvPool::owned(c(80)).unwrap(),
        },
    ])
    .unwrap();
    let cfg = Config {
        max_num_tokens: Some(512),
        max_context_length: None,
        chunking: Some(kvsched_core::Chunking {
            policy: kvsched_core::ChunkPolicy::FirstComeFirstServed,
            unit: 16,
        }),
        ..Config::default()
    };
    let mut s: Scheduler<KvGroups<'static, Owned, 2>, AdapterPool<4>, 2, 4> =
        Scheduler::new(cfg, k, AdapterPool::new(4, 8).unwrap()).unwrap();
    let mut out = SchedulerOutput::<2>::new();
    let mut spec = RequestSpec::new(1, Phase::ContextInit, len);
    spec.max_new_tokens = 8;
    s.submit(spec).unwrap();
    let mut decodes = 0;
    while decodes < 8 {
        s.schedule(&mut out).unwrap();
        decodes += out.generation().len();
        s.ensure_batch(&mut out).unwrap();
        let _ = s.take_moves();
        let _ = s.take_group_moves(1);
        s.complete_step(&out).unwrap();
    }
    assert!(s.check() && s.kv().check());
    (held(s.kv(), 0, 0), held(s.kv(), 1, 0))
}

#[test]
fn pages_held_at_long_context_full_only_against_grouped() {
    println!("| context | full-only pages | grouped: full + window pages | KV MiB full-only / grouped | saved |");
    println!("|---|---|---|---|---|");
    for len in [1024u32, 4096, 16_384, 32_768] {
        let (full, window) = pages_held(len);
        assert_eq!(
            full,
            (len + 8).div_ceil(16) as usize,
            "the full group holds every block"
        );
        assert!(
            window <= 512 / 16 + 1,
            "{len}: the window group holds {window} pages"
        );
        let page = |layers: u64| 16 * layers * GEMMA_KV_BYTES_PER_LAYER;
        let only = full as u64 * page(GEMMA_LAYERS);
        let grouped =
            full as u64 * page(GEMMA_GLOBAL) + window as u64 * page(GEMMA_LAYERS - GEMMA_GLOBAL);
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        println!(
            "| {len} | {full} | {full} + {window} | {:.1} / {:.1} | {:.1}x |",
            mib(only),
            mib(grouped),
            only as f64 / grouped as f64
        );
    }
}
