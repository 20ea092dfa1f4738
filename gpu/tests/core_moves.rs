//! Property test driven by kvsched-core's KV pool: random start / grow / revert / suspend / free
//! sequences run on `kvsched_core::page_pool::KvPool`, and the page moves it logs
//! (`KvBackend::take_moves`, called on the pool directly: there is no scheduler here) are executed
//! on the store after every step by the library binding (`kvsched_gpu::bind::KvPages`).
//!
//! The test writes fresh bytes into every block the pool hands out and then checks, after every
//! step, that each request's blocks still hold those bytes at the pages its table now names (GPU or
//! host, wherever the pool put them), that the pool's page conservation holds (free + held =
//! capacity per tier, `KvPool::check` and an independent count), and that no page is held twice.
//! Free pages are scribbled over between steps, as other requests would.

mod common;

use common::{cuda_property, fail, pattern};
use kvsched_core::ids::RequestId;
use kvsched_core::kv::{ContextPrep, KvBackend, KvRef, PageMove};
use kvsched_core::page_pool::{page_of, KvPool, KvPoolConfig, KvStats, KvStorage, Seq, SeqState};
use kvsched_gpu::{BlockTableShape, CudaKvStore, HostKvStore, KvMemory, KvPages, PoolShape, Tier};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

const SLOTS: u16 = 4;
const CONFIG: KvPoolConfig = KvPoolConfig {
    tokens_per_block: 4,
    gpu_pages: 12,
    host_pages: 8,
    slots: SLOTS as u32,
    max_blocks: 4,
};
const SHAPE: PoolShape = PoolShape::new(40, CONFIG.gpu_pages, CONFIG.host_pages);
const TABLES: BlockTableShape = BlockTableShape::new(SLOTS as u32, CONFIG.max_blocks);

#[derive(Clone, Debug)]
enum Op {
    /// First context chunk of `tokens` tokens in `slot`.
    Start {
        slot: u16,
        tokens: u32,
    },
    /// A generation step growing `slot` by `grow` tokens (resumes a suspended cache first).
    Grow {
        slot: u16,
        grow: u32,
    },
    /// Undo the last generation growth of `slot`.
    Revert {
        slot: u16,
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
        3 => (slot.clone(), 1..=16u32).prop_map(|(slot, tokens)| Op::Start { slot, tokens }),
        4 => (slot.clone(), 0..=5u32).prop_map(|(slot, grow)| Op::Grow { slot, grow }),
        1 => slot.clone().prop_map(|slot| Op::Revert { slot }),
        3 => slot.clone().prop_map(|slot| Op::Suspend { slot }),
        2 => slot.prop_map(|slot| Op::Free { slot }),
        1 => any::<u64>().prop_map(|seed| Op::Scribble { seed }),
    ];
    prop::collection::vec(op, 1..60)
}

fn kv_ref(slot: u16) -> KvRef {
    KvRef {
        slot,
        id: RequestId(u64::from(slot) + 1),
    }
}

struct Harness {
    /// The binding under test: the pool's move log as store calls.
    binding: KvPages,
    /// Bytes of each slot's blocks, by block index (the pool moves pages, not blocks).
    contents: Vec<Vec<Vec<u8>>>,
    next_seed: u64,
}

impl Harness {
    fn step<M: KvMemory>(
        &mut self,
        pool: &mut KvPool<'_>,
        mem: &mut M,
        op: &Op,
    ) -> Result<(), TestCaseError> {
        match *op {
            Op::Start { slot, tokens } => {
                let prep = ContextPrep::first(tokens);
                if pool.prepare_context(kv_ref(slot), prep).is_some()
                    && pool.seq(slot).state == SeqState::Active
                {
                    pool.resize_context(kv_ref(slot), tokens, true);
                }
            }
            Op::Grow { slot, grow } => {
                pool.try_allocate_generation(kv_ref(slot), grow);
            }
            Op::Revert { slot } => pool.revert_allocate_generation(kv_ref(slot)),
            Op::Suspend { slot } => pool.suspend(kv_ref(slot)),
            Op::Free { slot } => pool.free(kv_ref(slot)),
            Op::Scribble { seed } => {
                for tier in [Tier::Gpu, Tier::Host] {
                    for page in free_pages(pool, tier) {
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
        // The copies first: a suspended or resumed request's blocks move before anything else.
        let applied = self
            .binding
            .apply_moves(pool.take_moves(), mem)
            .map_err(fail)?;
        applied.event.wait().map_err(fail)?;
        prop_assert_eq!(
            (applied.offloaded + applied.reloaded) as usize,
            self.binding.last_log().len()
        );
        // Then the bytes of blocks the pool just handed out (growth) or took back (revert, free).
        for slot in 0..SLOTS {
            let seq = pool.seq(slot);
            let contents = &mut self.contents[usize::from(slot)];
            contents.truncate(seq.blocks as usize);
            for &entry in &pool.table(slot)[contents.len()..] {
                let (tier, page) = page_of(entry);
                let bytes = pattern(self.next_seed, SHAPE.page_bytes);
                self.next_seed += 1;
                mem.write_page(tier, page, &bytes).map_err(fail)?;
                contents.push(bytes);
            }
        }
        Ok(())
    }

    fn check<M: KvMemory>(&self, pool: &KvPool<'_>, mem: &M) -> Result<(), TestCaseError> {
        prop_assert!(
            pool.audit(&mut vec![0; pool.config().page_info_len()]),
            "KvPool::audit"
        );
        for tier in [Tier::Gpu, Tier::Host] {
            let mut owners = vec![0u32; SHAPE.pages(tier) as usize];
            for slot in 0..SLOTS {
                for (entry_tier, page) in pool.table(slot).iter().map(|&e| page_of(e)) {
                    if entry_tier == tier {
                        owners[page as usize] += 1;
                    }
                }
            }
            let used = owners.iter().filter(|&&n| n > 0).count() as u32;
            let free = if tier == Tier::Gpu {
                pool.gpu_free()
            } else {
                pool.host_free()
            };
            prop_assert!(
                owners.iter().all(|&n| n <= 1),
                "{} page held twice: {:?}",
                tier,
                owners
            );
            prop_assert_eq!(
                used + free,
                SHAPE.pages(tier),
                "{} tier: used + free = capacity",
                tier
            );
        }
        let mut out = vec![0; SHAPE.page_bytes];
        for slot in 0..SLOTS {
            let table = pool.table(slot);
            prop_assert_eq!(table.len(), self.contents[usize::from(slot)].len());
            for (block, (&entry, expected)) in table
                .iter()
                .zip(&self.contents[usize::from(slot)])
                .enumerate()
            {
                let (tier, page) = page_of(entry);
                mem.read_page(tier, page, &mut out).map_err(fail)?;
                prop_assert_eq!(
                    &out,
                    expected,
                    "slot {} block {} at {} page {}",
                    slot,
                    block,
                    tier,
                    page
                );
            }
        }
        Ok(())
    }
}

/// Pages of `tier` no slot's table names.
fn free_pages(pool: &KvPool<'_>, tier: Tier) -> Vec<u32> {
    let mut used = vec![false; SHAPE.pages(tier) as usize];
    for slot in 0..SLOTS {
        for (entry_tier, page) in pool.table(slot).iter().map(|&e| page_of(e)) {
            if entry_tier == tier {
                used[page as usize] = true;
            }
        }
    }
    (0..SHAPE.pages(tier))
        .filter(|&page| !used[page as usize])
        .collect()
}

/// Runs `ops` on a fresh pool and `mem`; the pool's activity counters at the end.
fn run<M: KvMemory>(mem: &mut M, ops: &[Op]) -> Result<KvStats, TestCaseError> {
    let mut gpu_free = vec![0; CONFIG.gpu_pages as usize];
    let mut host_free = vec![0; CONFIG.host_pages as usize];
    let mut tables = vec![0; CONFIG.table_len()];
    let mut seqs = vec![Seq::default(); usize::from(SLOTS)];
    let mut moves = vec![PageMove::default(); CONFIG.move_log_len()];
    let storage = KvStorage {
        gpu_free: &mut gpu_free,
        host_free: &mut host_free,
        tables: &mut tables,
        seqs: &mut seqs,
        moves: &mut moves,
        prefix: None,
    };
    let mut pool =
        KvPool::new(CONFIG, storage).map_err(|error| TestCaseError::fail(format!("{error:?}")))?;
    let mut harness = Harness {
        binding: KvPages::new(),
        contents: vec![Vec::new(); usize::from(SLOTS)],
        next_seed: 1,
    };
    for op in ops {
        harness.step(&mut pool, mem, op)?;
        harness.check(&pool, mem)?;
    }
    Ok(pool.stats())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn host_store_follows_core_pool_moves(ops in ops()) {
        let mut mem = HostKvStore::new(SHAPE, TABLES).unwrap();
        run(&mut mem, &ops)?;
    }
}

/// The same property on the CUDA backend (fewer cases: every case allocates a store).
#[test]
fn cuda_store_follows_core_pool_moves() {
    cuda_property(
        "cuda_store_follows_core_pool_moves",
        32,
        ops(),
        |ctx, ops| {
            let mut mem = CudaKvStore::new(ctx, SHAPE, TABLES).map_err(fail)?;
            run(&mut mem, &ops).map(drop)
        },
    );
}

/// The pool's moves actually happen in these sequences (the property is not vacuous).
#[test]
fn core_pool_logs_offloads_and_reloads() {
    let mut mem = HostKvStore::new(SHAPE, TABLES).unwrap();
    let ops = [
        Op::Start {
            slot: 0,
            tokens: 10,
        },
        Op::Start { slot: 1, tokens: 5 },
        Op::Suspend { slot: 0 },
        Op::Scribble { seed: 9 },
        Op::Start {
            slot: 2,
            tokens: 16,
        },
        Op::Grow { slot: 0, grow: 3 },
        Op::Suspend { slot: 1 },
        Op::Grow { slot: 1, grow: 0 },
    ];
    let stats = run(&mut mem, &ops).unwrap();
    assert_eq!(stats.suspends, 2);
    assert_eq!(
        stats.pages_offloaded,
        3 + 2,
        "slot 0 had 3 blocks, slot 1 had 2"
    );
    assert_eq!(stats.pages_reloaded, 3 + 2, "both came back");
}
