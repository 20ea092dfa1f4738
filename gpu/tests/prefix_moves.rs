//! Property test of shared pages on real memory: random first chunks over prompt families under two
//! adapter roots, growth, suspension and frees run on a `kvsched_core::page_pool::KvPool` with a prefix
//! cache, and the page moves it logs (cached blocks demoted to the host tier, claimed blocks reloaded,
//! private pages suspended and resumed) are executed on the store by the library binding
//! (`kvsched_gpu::bind::KvPages`) after every step.
//!
//! Every block's bytes are a pattern of what it holds: a prompt block of a hashed prompt the pattern of
//! its chained key (so two requests computing the same block write the same bytes), anything else a
//! fresh pattern. The test writes only pages the pool hands a row privately (it fails if asked to write
//! a page another row or the cache holds), scribbles over free pages between steps, and checks after
//! every step that every row's blocks and every cached page hold their bytes wherever the pool put them
//! — so a shared page's bytes never change, and a demoted or reloaded block arrives whole — and that
//! the pool's audit (reference counts, free pages, the cache's own invariants) holds.

mod common;

use common::{cuda_property, fail, pattern};
use kvsched_core::ids::RequestId;
use kvsched_core::kv::chain;
use kvsched_core::kv::{ContextPrep, KvBackend, KvRef, PageMove, PrefixReuse};
use kvsched_core::page_pool::{
    page_of, KvPool, KvPoolConfig, KvStorage, PageInfo, PrefixStats, PrefixStorage, Seq, HOST,
};
use kvsched_gpu::{BlockTableShape, CudaKvStore, HostKvStore, KvMemory, KvPages, PoolShape, Tier};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

const SLOTS: u16 = 5;
const TPB: u32 = 4;
const CONFIG: KvPoolConfig = KvPoolConfig {
    tokens_per_block: TPB,
    gpu_pages: 14,
    host_pages: 10,
    slots: SLOTS as u32,
    max_blocks: 8,
};
const SHAPE: PoolShape = PoolShape::new(40, CONFIG.gpu_pages, CONFIG.host_pages);
const TABLES: BlockTableShape = BlockTableShape::new(SLOTS as u32, CONFIG.max_blocks);

#[derive(Clone, Debug)]
enum Op {
    /// A first chunk in `slot`: root A or B, a prompt family whose first `diverge` blocks it shares,
    /// `tokens` tokens, computed whole and committed.
    Start {
        slot: u16,
        root_b: bool,
        family: u64,
        diverge: u32,
        tokens: u32,
    },
    /// A generation step growing `slot` by `grow` tokens (resumes a suspended cache first).
    Grow {
        slot: u16,
        grow: u32,
    },
    Suspend {
        slot: u16,
    },
    Free {
        slot: u16,
    },
    /// Overwrite every free page of both tiers.
    Scribble {
        seed: u64,
    },
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let slot = 0..SLOTS;
    let op = prop_oneof![
        4 => (slot.clone(), any::<bool>(), 0..3u64, 0..8u32, 1..=32u32).prop_map(
            |(slot, root_b, family, diverge, tokens)| Op::Start { slot, root_b, family, diverge, tokens }
        ),
        3 => (slot.clone(), 0..=6u32).prop_map(|(slot, grow)| Op::Grow { slot, grow }),
        2 => slot.clone().prop_map(|slot| Op::Suspend { slot }),
        2 => slot.prop_map(|slot| Op::Free { slot }),
        1 => any::<u64>().prop_map(|seed| Op::Scribble { seed }),
    ];
    prop::collection::vec(op, 1..80)
}

fn kv_ref(slot: u16) -> KvRef {
    KvRef {
        slot,
        id: RequestId(u64::from(slot) + 1),
    }
}

struct Harness {
    binding: KvPages,
    /// The pattern seed of each slot's blocks, by block index.
    seeds: Vec<Vec<u64>>,
    next_seed: u64,
}

impl Harness {
    fn fresh(&mut self) -> u64 {
        self.next_seed += 1;
        u64::MAX - self.next_seed
    }

    /// Executes the pool's move log on `mem`.
    fn apply<M: KvMemory>(
        &mut self,
        pool: &mut KvPool<'_>,
        mem: &mut M,
    ) -> Result<(), TestCaseError> {
        let applied = self
            .binding
            .apply_moves(pool.take_moves(), mem)
            .map_err(fail)?;
        applied.event.wait().map_err(fail)?;
        prop_assert_eq!(
            (applied.offloaded + applied.reloaded) as usize,
            self.binding.last_log().len()
        );
        Ok(())
    }

    /// Writes the row's blocks from `from` on (its new private pages).
    fn write<M: KvMemory>(
        &mut self,
        pool: &KvPool<'_>,
        mem: &mut M,
        slot: u16,
        from: usize,
    ) -> Result<(), TestCaseError> {
        for (b, &entry) in pool.table(slot).iter().enumerate().skip(from) {
            let info = pool.page_info(entry).unwrap_or_default();
            prop_assert!(
                info.refs() == 1 && !info.cached(),
                "slot {} block {} would write a shared page",
                slot,
                b
            );
            let (tier, page) = page_of(entry);
            let seed = self.seeds[usize::from(slot)][b];
            mem.write_page(tier, page, &pattern(seed, SHAPE.page_bytes))
                .map_err(fail)?;
        }
        Ok(())
    }

    fn step<M: KvMemory>(
        &mut self,
        pool: &mut KvPool<'_>,
        mem: &mut M,
        op: &Op,
    ) -> Result<(), TestCaseError> {
        match *op {
            Op::Start {
                slot,
                root_b,
                family,
                diverge,
                tokens,
            } => {
                if pool.cache(kv_ref(slot)).exists() {
                    return Ok(());
                }
                let root = if root_b { 0xb } else { 0xa };
                let hashes: Vec<u64> = (0..u64::from(tokens / TPB))
                    .map(|k| {
                        if k < u64::from(diverge) {
                            family * 100 + k
                        } else {
                            self.fresh()
                        }
                    })
                    .collect();
                pool.set_prefix(kv_ref(slot), root, &hashes);
                let prep = ContextPrep::first(tokens);
                let reused = pool.prepare_context(kv_ref(slot), prep).unwrap_or(0);
                if !pool.resize_context(kv_ref(slot), tokens, true) {
                    pool.free(kv_ref(slot));
                    return self.apply(pool, mem);
                }
                self.apply(pool, mem)?;
                let mut key = root;
                let mut seeds: Vec<u64> = hashes
                    .iter()
                    .map(|&h| {
                        key = chain(key, h);
                        key
                    })
                    .collect();
                while seeds.len() < pool.table(slot).len() {
                    let s = self.fresh();
                    seeds.push(s);
                }
                self.seeds[usize::from(slot)] = seeds;
                self.write(pool, mem, slot, (reused / TPB) as usize)?;
                pool.commit(kv_ref(slot), tokens);
            }
            Op::Grow { slot, grow } => {
                let before = pool.table(slot).len();
                if pool.try_allocate_generation(kv_ref(slot), grow) {
                    self.apply(pool, mem)?;
                    while self.seeds[usize::from(slot)].len() < pool.table(slot).len() {
                        let s = self.fresh();
                        self.seeds[usize::from(slot)].push(s);
                    }
                    self.write(pool, mem, slot, before)?;
                }
            }
            Op::Suspend { slot } => pool.suspend(kv_ref(slot)),
            Op::Free { slot } => pool.free(kv_ref(slot)),
            Op::Scribble { seed } => {
                let pages = |tier: Tier| {
                    if tier == Tier::Gpu {
                        CONFIG.gpu_pages
                    } else {
                        CONFIG.host_pages
                    }
                };
                for tier in [Tier::Gpu, Tier::Host] {
                    for page in 0..pages(tier) {
                        let entry = if tier == Tier::Gpu { page } else { page | HOST };
                        let info = pool.page_info(entry).unwrap_or_default();
                        if info.refs() == 0 && !info.cached() {
                            mem.write_page(
                                tier,
                                page,
                                &pattern(seed ^ u64::from(page), SHAPE.page_bytes),
                            )
                            .map_err(fail)?;
                        }
                    }
                }
            }
        }
        self.apply(pool, mem)
    }

    fn check<M: KvMemory>(&self, pool: &KvPool<'_>, mem: &M) -> Result<(), TestCaseError> {
        prop_assert!(
            pool.audit(&mut vec![0; CONFIG.page_info_len()]),
            "KvPool::audit"
        );
        let mut out = vec![0; SHAPE.page_bytes];
        for slot in 0..SLOTS {
            for (b, &entry) in pool.table(slot).iter().enumerate() {
                let (tier, page) = page_of(entry);
                mem.read_page(tier, page, &mut out).map_err(fail)?;
                let seed = self.seeds[usize::from(slot)][b];
                prop_assert!(
                    out == pattern(seed, SHAPE.page_bytes),
                    "slot {} block {} at {} page {}",
                    slot,
                    b,
                    tier,
                    page
                );
            }
        }
        for (tier, pages) in [
            (Tier::Gpu, CONFIG.gpu_pages),
            (Tier::Host, CONFIG.host_pages),
        ] {
            for page in 0..pages {
                let entry = if tier == Tier::Gpu { page } else { page | HOST };
                let info = pool.page_info(entry).unwrap_or_default();
                if info.cached() {
                    mem.read_page(tier, page, &mut out).map_err(fail)?;
                    prop_assert!(
                        out == pattern(info.key(), SHAPE.page_bytes),
                        "cached {} page {}",
                        tier,
                        page
                    );
                }
            }
        }
        Ok(())
    }
}

/// Runs `ops` on a fresh pool with a prefix cache and `mem`; the cache's counters at the end.
fn run<M: KvMemory>(mem: &mut M, ops: &[Op]) -> Result<PrefixStats, TestCaseError> {
    let mut gpu_free = vec![0; CONFIG.gpu_pages as usize];
    let mut host_free = vec![0; CONFIG.host_pages as usize];
    let mut tables = vec![0; CONFIG.table_len()];
    let mut seqs = vec![Seq::default(); usize::from(SLOTS)];
    let mut moves = vec![PageMove::default(); CONFIG.move_log_len()];
    let mut pages = vec![PageInfo::default(); CONFIG.page_info_len()];
    let mut index = vec![0; CONFIG.index_len()];
    let mut hashes = vec![0; CONFIG.table_len()];
    let mut stamps = vec![0; CONFIG.stamps_len()];
    let storage = KvStorage {
        gpu_free: &mut gpu_free,
        host_free: &mut host_free,
        tables: &mut tables,
        seqs: &mut seqs,
        moves: &mut moves,
        prefix: Some(PrefixStorage {
            pages: &mut pages,
            index: &mut index,
            hashes: &mut hashes,
            stamps: &mut stamps,
        }),
    };
    let mut pool =
        KvPool::new(CONFIG, storage).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
    let mut harness = Harness {
        binding: KvPages::new(),
        seeds: vec![Vec::new(); usize::from(SLOTS)],
        next_seed: 1,
    };
    for op in ops {
        harness.step(&mut pool, mem, op)?;
        harness.check(&pool, mem)?;
    }
    pool.prefix_stats()
        .ok_or_else(|| TestCaseError::fail("a prefix cache"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn host_store_keeps_shared_pages_intact(ops in ops()) {
        let mut mem = HostKvStore::new(SHAPE, TABLES).unwrap();
        run(&mut mem, &ops)?;
    }
}

/// The same property on the CUDA backend (fewer cases: every case allocates a store).
#[test]
fn cuda_store_keeps_shared_pages_intact() {
    cuda_property(
        "cuda_store_keeps_shared_pages_intact",
        32,
        ops(),
        |ctx, ops| {
            let mut mem = CudaKvStore::new(ctx, SHAPE, TABLES).map_err(fail)?;
            run(&mut mem, &ops).map(drop)
        },
    );
}

/// Sharing, demotion and reload happen in these sequences (the property is not vacuous).
#[test]
fn shared_blocks_are_demoted_and_reloaded_with_their_bytes() {
    let mut mem = HostKvStore::new(SHAPE, TABLES).unwrap();
    let start = |slot, root_b, family, tokens| Op::Start {
        slot,
        root_b,
        family,
        diverge: 8,
        tokens,
    };
    let ops = [
        start(0, false, 1, 16),
        start(1, false, 1, 18),
        Op::Free { slot: 0 },
        Op::Free { slot: 1 },
        // Other work fills the GPU: three of the four cached blocks are demoted.
        start(2, true, 2, 32),
        Op::Scribble { seed: 5 },
        start(3, true, 0, 20),
        Op::Free { slot: 2 },
        Op::Scribble { seed: 6 },
        // The family comes back: its demoted blocks are claimed and reloaded from the host tier.
        start(4, false, 1, 17),
    ];
    let stats = run(&mut mem, &ops).unwrap();
    // Demoted: three for slot 3, then four of slot 2's blocks to make room for the reloads.
    assert_eq!((stats.demoted, stats.host_hits), (3 + 4, 3), "{stats:?}");
    assert_eq!(stats.gpu_hits, 4 + 1, "{stats:?}");
}
