//! Prefix reuse across KV groups (`kv_groups`): a hit is the longest prefix whose blocks the
//! full-attention group holds and whose last window the sliding-window group holds; the window
//! group's cache evicts its idle blocks whatever their children, so a running request's released
//! blocks cost no page; the probes answer with the same hit; and, under random operations, every
//! pool's invariants (the exact audit included) hold and a hit's rows hold exactly the blocks the
//! rule names.

mod support;

use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::kv::{chain, ContextPrep, KvBackend, KvRef, PrefixReuse};
use kvsched_core::kv_groups::{Attention, Group, KvGroups};
use kvsched_core::output::SchedulerOutput;
use kvsched_core::page_pool::{KvPool, KvPoolConfig, NO_PAGE};
use kvsched_core::request::RequestSpec;
use kvsched_core::scheduler::{Handle, Scheduler};
use kvsched_core::storage::Owned;
use kvsched_core::{Config, Error, Phase, RequestId};

type Groups = KvGroups<'static, Owned, 2>;

const TPB: u32 = 16;
/// The window: 4 pages.
const WINDOW: u32 = 64;
const WB: u32 = WINDOW / TPB;

fn cfg(gpu_pages: u32, host_pages: u32) -> KvPoolConfig {
    KvPoolConfig {
        tokens_per_block: TPB,
        gpu_pages,
        host_pages,
        slots: 8,
        max_blocks: 32,
    }
}

/// A full group of `full` GPU pages and a window group of `window`, both with prefix caches.
fn groups(full: u32, window: u32, host: u32) -> Groups {
    KvGroups::new([
        Group {
            attention: Attention::Full,
            pool: KvPool::owned_with_prefix_cache(cfg(full, host)).unwrap(),
        },
        Group {
            attention: Attention::Sliding { window: WINDOW },
            pool: KvPool::owned_with_prefix_cache(cfg(window, host)).unwrap(),
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

/// `n` block hashes: the first `shared` of family `family`, the rest the request's own.
fn hashes(family: u64, shared: u32, own: u64, n: u32) -> Vec<u64> {
    (0..u64::from(n))
        .map(|k| {
            if k < u64::from(shared) {
                family * 1000 + k
            } else {
                own * 100_000 + k
            }
        })
        .collect()
}

/// Runs a request through prefill in 64-token chunks (each prepared at its position, then committed),
/// as a scheduler does, then frees it.
fn run_and_free(k: &mut Groups, slot: u16, root: u64, h: &[u64], prompt: u32) {
    support::prefill(k, slot, root, h, prompt, 64);
    let _ = k.take_moves();
    let _ = k.take_group_moves(1);
    k.free(r(slot));
}

/// The entries of group `g`'s table for `slot` that name pages, with their block indices.
fn held(k: &Groups, g: usize, slot: u16) -> Vec<u32> {
    let pool = &k.groups()[g].pool;
    let blocks = pool.seq(slot).blocks as usize;
    (0..blocks)
        .filter(|&b| pool.table(slot)[b] != NO_PAGE)
        .map(|b| b as u32)
        .collect()
}

#[test]
fn a_repeated_prompt_reuses_every_full_block_and_the_last_window() {
    let mut k = groups(64, 32, 0);
    let h = hashes(1, 12, 0, 12);
    run_and_free(&mut k, 0, 7, &h, 200);
    k.set_prefix(r(1), 7, &h);
    // 12 full blocks, short of the prompt's last token: all 12 (192 tokens).
    let prep = ContextPrep::first(200);
    assert_eq!(k.probe_context_reuse(r(1), prep), Some(192));
    assert_eq!(k.prepare_context(r(1), prep), Some(192));
    assert_eq!(held(&k, 0, 1), (0..12).collect::<Vec<_>>());
    assert_eq!(held(&k, 1, 1), (12 - WB..12).collect::<Vec<_>>());
    let [full, window] = k.groups();
    assert_eq!(
        (
            full.pool.prefix_stats().unwrap().gpu_hits,
            window.pool.prefix_stats().unwrap().gpu_hits
        ),
        (12, u64::from(WB))
    );
    // The window group's blocks are the hit's last window, by key.
    let keys: Vec<u64> = h
        .iter()
        .scan(7u64, |key, &x| {
            *key = chain(*key, x);
            Some(*key)
        })
        .collect();
    for b in 12 - WB..12 {
        let e = window.pool.table(1)[b as usize];
        assert_eq!(window.pool.page_info(e).unwrap().key(), keys[b as usize]);
    }
    assert!(k.check());
    // The next growth releases nothing more and takes one page in each group.
    assert!(k.resize_context(r(1), 200, true));
    assert_eq!(held(&k, 1, 1), (12 - WB..13).collect::<Vec<_>>());
}

#[test]
fn a_running_requests_released_window_blocks_cost_no_page() {
    // The window group has 9 pages for a 20-block prompt in 4-block chunks (a chunk reads the window
    // before it: 8 pages): it runs because each released block is idle at once and the next chunk
    // evicts it (a leaf-first cache would keep it as a parent of the row's later blocks).
    let mut k = groups(64, 9, 0);
    let h = hashes(2, 20, 0, 20);
    run_and_free(&mut k, 0, 3, &h, 320);
    let w = &k.groups()[1].pool;
    assert!(w.prefix_stats().unwrap().evicted >= 11);
    assert_eq!(w.gpu_free() + w.idle_pages(kvsched_core::kv::Tier::Gpu), 9);
    assert!(k.check());
}

#[test]
fn a_window_group_that_lost_the_window_cuts_the_hit_short_and_the_probes_follow() {
    // Request 0 prefills 20 blocks; the window group keeps only its last blocks. Request 1 shares
    // the first 6 blocks: the full group holds them, the window group none of blocks 2..6, so no
    // hit (every shorter hit needs all its blocks from the first).
    let mut k = groups(64, 9, 0);
    run_and_free(&mut k, 0, 3, &hashes(2, 20, 0, 20), 320);
    let h = hashes(2, 6, 9, 12);
    k.set_prefix(r(1), 3, &h);
    let prep = ContextPrep::first(200);
    let lead = &k.groups()[0].pool;
    assert_eq!(lead.probe_context_reuse(r(1), prep), Some(96));
    assert_eq!(k.probe_context_reuse(r(1), prep), Some(0));
    // The first block request 1 contributes is its first, not the leader's seventh.
    assert_eq!(k.probe_first_new_block(r(1), prep), Some(chain(3, h[0])));
    assert_eq!(k.prepare_context(r(1), prep), Some(0));
    assert!(held(&k, 0, 1).is_empty() && held(&k, 1, 1).is_empty());
    // A prompt that is request 0's whole: the window group holds its last window, the hit is full.
    k.free(r(1));
    let whole = hashes(2, 20, 0, 20);
    k.set_prefix(r(2), 3, &whole);
    assert_eq!(k.prepare_context(r(2), ContextPrep::first(330)), Some(320));
    assert_eq!(held(&k, 1, 2), (20 - WB..20).collect::<Vec<_>>());
    assert!(k.check());
}

#[test]
fn groups_with_prefix_caches_in_some_pools_only_are_refused() {
    let got = KvGroups::new([
        Group {
            attention: Attention::Full,
            pool: KvPool::owned_with_prefix_cache(cfg(8, 0)).unwrap(),
        },
        Group {
            attention: Attention::Sliding { window: WINDOW },
            pool: KvPool::owned(cfg(8, 0)).unwrap(),
        },
    ]);
    match got {
        Err(Error::Invalid(why)) => assert!(why.contains("every pool or in none"), "{why}"),
        other => panic!("{other:?}"),
    }
}

/// Through the scheduler: a finished request's prompt is reused by the next with the same prompt,
/// in both groups, and the window group's pages stay within the window while it decodes.
#[test]
fn the_scheduler_reuses_a_finished_prompt_across_groups() {
    let adapters = AdapterPool::new(4, 8).unwrap();
    let mut s: Scheduler<Groups, AdapterPool<4>, 8, 4> =
        Scheduler::new(Config::default(), groups(64, 16, 0), adapters).unwrap();
    let mut out = SchedulerOutput::<8>::new();
    let h = hashes(5, 15, 0, 15);
    let submit = |s: &mut Scheduler<Groups, AdapterPool<4>, 8, 4>, id: u64| -> Handle {
        let mut spec = RequestSpec::new(id, Phase::ContextInit, 250);
        spec.max_new_tokens = 30;
        s.submit_with_prefix(spec, 0, &h).unwrap()
    };
    let a = submit(&mut s, 1);
    for _ in 0..31 {
        s.schedule(&mut out).unwrap();
        s.ensure_batch(&mut out).unwrap();
        let _ = s.take_moves();
        let _ = s.take_group_moves(1);
        s.complete_step(&out).unwrap();
        assert!(s.check() && s.kv().check());
    }
    s.remove(a).unwrap();
    let b = submit(&mut s, 2);
    s.schedule(&mut out).unwrap();
    let chunk = out.context().first().expect("the prompt's chunk");
    // 15 full blocks, all reused: the chunk computes the prompt's last 10 tokens.
    assert_eq!(chunk.tokens, 10);
    assert_eq!(held(s.kv(), 1, b.index()).len() as u32, WB + 1);
}

mod random {
    //! Random operations on grouped pools with prefix caches (hashes from two families, so prompts
    //! share prefixes): after every operation the groups agree, every pool passes its exact audit,
    //! and a fresh first chunk's reuse is the hit the probe predicted, with its rows holding every
    //! block up to it (full group) and its last window (window group), by key.
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
        Prepare(u16, u32, u64, u32),
        Resize(u16, u32, bool),
        Commit(u16),
        Allocate(u16, u32),
        Suspend(u16),
        Free(u16),
        Preempt(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        let slot = 0u16..4;
        prop_oneof![
            2 => (slot.clone(), 17u32..400, 1u64..3, 0u32..25)
                .prop_map(|(s, p, f, shared)| Op::Prepare(s, p, f, shared)),
            3 => (slot.clone(), 1u32..120, any::<bool>()).prop_map(|(s, t, f)| Op::Resize(s, t, f)),
            2 => slot.clone().prop_map(Op::Commit),
            3 => (slot.clone(), 1u32..4).prop_map(|(s, g)| Op::Allocate(s, g)),
            1 => slot.clone().prop_map(Op::Suspend),
            1 => slot.clone().prop_map(Op::Free),
            1 => slot.prop_map(Op::Preempt),
        ]
    }

    /// A fresh first chunk: the probe's hit is what it reuses, and its rows hold what the rule says.
    fn prepare(
        k: &mut Groups,
        s: u16,
        prompt: u32,
        family: u64,
        shared: u32,
    ) -> Result<(), TestCaseError> {
        if k.cache(r(s)).exists() {
            let _ = k.prepare_context(r(s), ContextPrep::first(prompt));
            return Ok(());
        }
        let h = hashes(family, shared, u64::from(s) + 10, prompt / TPB);
        k.set_prefix(r(s), 1, &h);
        let prep = ContextPrep::first(prompt);
        let probed = k.probe_context_reuse(r(s), prep);
        let Some(reused) = k.prepare_context(r(s), prep) else {
            return Ok(());
        };
        prop_assert_eq!(probed, Some(reused));
        let m = reused / TPB;
        prop_assert_eq!(held(k, 0, s), (0..m).collect::<Vec<_>>());
        prop_assert_eq!(held(k, 1, s), (m - m.min(WB)..m).collect::<Vec<_>>());
        let mut key = 1u64;
        for (b, &x) in h.iter().enumerate().take(m as usize) {
            key = chain(key, x);
            for g in k.groups() {
                let e = g.pool.table(s)[b];
                if e != NO_PAGE {
                    prop_assert_eq!(g.pool.page_info(e).unwrap().key(), key);
                }
            }
        }
        Ok(())
    }

    fn apply(k: &mut Groups, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Prepare(s, p, f, shared) => prepare(k, s, p, f, shared)?,
            Op::Resize(s, t, first) => {
                let cap = k.groups()[0].pool.seq(s).capacity + t;
                let _ = k.resize_context(r(s), cap, first);
            }
            Op::Commit(s) => {
                let cap = k.groups()[0].pool.seq(s).capacity;
                k.commit(r(s), cap);
            }
            Op::Allocate(s, g) => {
                let _ = k.try_allocate_generation(r(s), g);
            }
            Op::Suspend(s) => k.suspend(r(s)),
            Op::Free(s) => k.free(r(s)),
            Op::Preempt(s) => k.preempt(r(s)),
        }
        let _ = k.take_moves();
        let _ = k.take_group_moves(1);
        Ok(())
    }

    fn audit(k: &Groups) -> Result<(), TestCaseError> {
        prop_assert!(k.check(), "a pool's invariants");
        for g in k.groups() {
            let mut scratch = vec![0u32; g.pool.config().page_info_len()];
            prop_assert!(g.pool.audit(&mut scratch), "a pool's audit");
        }
        let [full, window] = k.groups();
        for s in 0..8u16 {
            prop_assert_eq!(full.pool.cache(r(s)), window.pool.cache(r(s)), "slot {}", s);
            prop_assert_eq!(full.pool.seq(s).capacity, window.pool.seq(s).capacity);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn grouped_prefix_caches_keep_every_invariant(
            full in 8u32..48,
            window in 6u32..16,
            host in prop::bool::ANY,
            ops in prop::collection::vec(op(), 1..200),
        ) {
            let mut k = groups(full, window, if host { 24 } else { 0 });
            for op in ops {
                apply(&mut k, op).map_err(|e| TestCaseError::fail(format!("after {op:?}: {e}")))?;
                audit(&k).map_err(|e| TestCaseError::fail(format!("after {op:?}: {e}")))?;
            }
            for s in 0..4 {
                k.free(r(s));
            }
            // Everything comes back, free or cached and idle.
            for (g, total) in k.groups().iter().zip([full, window]) {
                let idle = g.pool.idle_pages(kvsched_core::kv::Tier::Gpu);
                prop_assert_eq!(g.pool.gpu_free() + idle, total);
            }
        }
    }
}

/// Upstream's Z11 (spec §5 Z, item 11: "VSWA manager → still [0]"): the V2 pass's prefix-aware skip
/// has no variable-window gate (C++ disables it for VSWA), so on a variable-window backend with block
/// reuse a first chunk whose first new block another first chunk of the pass contributes is still
/// deferred: of two identical prompts only the first runs; the next pass the second reuses its
/// blocks, in both groups. The conformance runner's scripted backend has no groups, so Z11 is here, on
/// the real `KvGroups`.
#[test]
fn z11_a_variable_window_backend_still_defers_the_duplicate() {
    let adapters = AdapterPool::new(4, 8).unwrap();
    let mut s: Scheduler<Groups, AdapterPool<4>, 8, 4> =
        Scheduler::new(Config::default(), groups(64, 16, 0), adapters).unwrap();
    let mut out = SchedulerOutput::<8>::new();
    let h = hashes(6, 8, 0, 8);
    let mut handles = Vec::new();
    for id in [0u64, 1] {
        let mut spec = RequestSpec::new(id, Phase::ContextInit, 140);
        spec.max_new_tokens = 4;
        handles.push(s.submit_with_prefix(spec, 0, &h).unwrap());
    }
    s.schedule(&mut out).unwrap();
    let ids: Vec<u16> = out.context().iter().map(|c| c.listed.slot()).collect();
    assert_eq!(ids, [handles[0].index()], "the duplicate is deferred");
    s.ensure_batch(&mut out).unwrap();
    let _ = s.take_moves();
    let _ = s.take_group_moves(1);
    s.complete_step(&out).unwrap();
    // The next pass: request 0 decodes, request 1 reuses its 8 blocks and computes 12 tokens.
    s.schedule(&mut out).unwrap();
    let chunk = out.context().first().expect("the duplicate runs");
    assert_eq!(
        (chunk.listed.slot(), chunk.tokens),
        (handles[1].index(), 12)
    );
    let held_1 = held(s.kv(), 1, handles[1].index());
    assert_eq!(held_1, (8 - WB..9).collect::<Vec<_>>());
}
