//! Property test: random admit / suspend / resume / free sequences against a simple model.
//!
//! The test keeps its own two-tier page allocator (free lists) and a list of requests, each owning
//! pages in one tier with known contents. Every suspension offloads a request's GPU pages to fresh
//! host pages and frees the GPU pages; every resume reloads them into fresh (usually different) GPU
//! pages. Free pages are scribbled over between steps, as other requests would. After every step:
//! page conservation per tier (free + used = capacity, no page owned twice) and every byte of every
//! live request's pages.
//!
//! The moves come from this model, not from kvsched-core's pool: the model picks scattered pages
//! and batches several requests into one move list, which the core pool's low-ids-first free stacks
//! rarely do. tests/core_moves.rs drives the store with the core pool's own move log.

mod common;

use common::{cuda_property, fail, pattern};
use kvsched_core::RequestId;
use kvsched_gpu::{
    BlockTableShape, CopyMethod, CudaKvStore, HostKvStore, KvMemory, PageMove, PoolShape, Tier,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// Small pages, few of them: pressure on both tiers, and runs as well as scattered moves.
/// 48-byte pages: a multiple of 16, so the CUDA store's default plan runs the copy kernel; three
/// 16-byte layers in the layer-major cases.
const SHAPE: PoolShape = PoolShape::new(48, 12, 8);
const TABLES: BlockTableShape = BlockTableShape::new(1, 1);

#[derive(Clone, Debug)]
enum Op {
    /// A new request takes `pages` GPU pages (lowest free pages when `pick` is even, scattered
    /// otherwise) and writes `seed`'s pattern.
    Admit {
        pages: usize,
        pick: usize,
        seed: u64,
    },
    /// The `who`-th GPU-resident request is offloaded, if the host tier has room.
    Suspend { who: usize, pick: usize },
    /// Every GPU-resident request that fits is offloaded in one move list.
    SuspendAll { pick: usize },
    /// The `who`-th host-resident request is reloaded, if the GPU tier has room.
    Resume { who: usize, pick: usize },
    /// The `who`-th request (any tier) is freed.
    Free { who: usize },
    /// Every free page of both tiers is overwritten.
    Scribble { seed: u64 },
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..60)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1..=4usize, any::<usize>(), any::<u64>()).prop_map(|(pages, pick, seed)| Op::Admit { pages, pick, seed }),
        3 => (any::<usize>(), any::<usize>()).prop_map(|(who, pick)| Op::Suspend { who, pick }),
        1 => any::<usize>().prop_map(|pick| Op::SuspendAll { pick }),
        3 => (any::<usize>(), any::<usize>()).prop_map(|(who, pick)| Op::Resume { who, pick }),
        2 => any::<usize>().prop_map(|who| Op::Free { who }),
        1 => any::<u64>().prop_map(|seed| Op::Scribble { seed }),
    ]
}

#[derive(Debug)]
struct Request {
    tier: Tier,
    pages: Vec<u32>,
    contents: Vec<Vec<u8>>,
}

#[derive(Debug)]
struct Harness {
    gpu_free: Vec<u32>,
    host_free: Vec<u32>,
    requests: Vec<Request>,
}

impl Harness {
    fn new() -> Self {
        Self {
            gpu_free: (0..SHAPE.gpu_pages).collect(),
            host_free: (0..SHAPE.host_pages).collect(),
            requests: vec![],
        }
    }

    fn free_list(&mut self, tier: Tier) -> &mut Vec<u32> {
        match tier {
            Tier::Gpu => &mut self.gpu_free,
            Tier::Host => &mut self.host_free,
        }
    }

    /// Takes `count` pages of `tier`, or `None` (taking nothing) when there are too few.
    fn take(&mut self, tier: Tier, count: usize, pick: usize) -> Option<Vec<u32>> {
        let free = self.free_list(tier);
        if free.len() < count {
            return None;
        }
        if pick % 2 == 0 {
            // Lowest pages first: consecutive page ids, so moves merge into runs.
            free.sort_unstable_by(|a, b| b.cmp(a));
            let at = free.len() - count;
            Some(free.split_off(at).into_iter().rev().collect())
        } else {
            let mut state = pick;
            Some(
                (0..count)
                    .map(|_| {
                        state = state
                            .wrapping_mul(6_364_136_223_846_793_005)
                            .wrapping_add(1_442_695_040_888_963_407);
                        free.swap_remove((state >> 33) % free.len())
                    })
                    .collect(),
            )
        }
    }

    fn nth_in(&self, tier: Tier, who: usize) -> Option<usize> {
        let resident: Vec<usize> = (0..self.requests.len())
            .filter(|&i| self.requests[i].tier == tier)
            .collect();
        (!resident.is_empty()).then(|| resident[who % resident.len()])
    }

    /// Moves requests `which` to the other tier in one move list.
    fn migrate<M: KvMemory>(
        &mut self,
        mem: &mut M,
        which: &[usize],
        pick: usize,
    ) -> Result<(), TestCaseError> {
        let mut moves = Vec::new();
        let mut released = Vec::new();
        let mut from = Tier::Gpu;
        for &index in which {
            from = self.requests[index].tier;
            let to = from.other();
            let count = self.requests[index].pages.len();
            let Some(targets) = self.take(to, count, pick.wrapping_add(index)) else {
                continue;
            };
            let request = &mut self.requests[index];
            moves.extend(
                request
                    .pages
                    .iter()
                    .zip(&targets)
                    .map(|(&src, &dst)| PageMove {
                        request: RequestId(index as u64),
                        from,
                        src,
                        dst,
                    }),
            );
            released.extend(std::mem::replace(&mut request.pages, targets));
            request.tier = to;
        }
        let event = match from {
            Tier::Gpu => mem.offload(&moves),
            Tier::Host => mem.reload(&moves),
        };
        event
            .map_err(|error| TestCaseError::fail(error.to_string()))?
            .wait()
            .map_err(fail)?;
        // The source pages are free only once the copy is done.
        self.free_list(from).extend(released);
        Ok(())
    }

    fn step<M: KvMemory>(&mut self, mem: &mut M, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Admit { pages, pick, seed } => {
                let Some(taken) = self.take(Tier::Gpu, pages, pick) else {
                    return Ok(());
                };
                let mut contents = Vec::new();
                for (i, &page) in taken.iter().enumerate() {
                    let bytes = pattern(seed.wrapping_add(i as u64), SHAPE.page_bytes);
                    mem.write_page(Tier::Gpu, page, &bytes).map_err(fail)?;
                    contents.push(bytes);
                }
                self.requests.push(Request {
                    tier: Tier::Gpu,
                    pages: taken,
                    contents,
                });
            }
            Op::Suspend { who, pick } => {
                if let Some(index) = self.nth_in(Tier::Gpu, who) {
                    self.migrate(mem, &[index], pick)?;
                }
            }
            Op::SuspendAll { pick } => {
                let all: Vec<usize> = (0..self.requests.len())
                    .filter(|&i| self.requests[i].tier == Tier::Gpu)
                    .collect();
                self.migrate(mem, &all, pick)?;
            }
            Op::Resume { who, pick } => {
                if let Some(index) = self.nth_in(Tier::Host, who) {
                    self.migrate(mem, &[index], pick)?;
                }
            }
            Op::Free { who } => {
                if !self.requests.is_empty() {
                    let request = self.requests.swap_remove(who % self.requests.len());
                    self.free_list(request.tier).extend(request.pages);
                }
            }
            Op::Scribble { seed } => {
                for tier in [Tier::Gpu, Tier::Host] {
                    for page in self.free_list(tier).clone() {
                        let junk = pattern(seed ^ u64::from(page), SHAPE.page_bytes);
                        mem.write_page(tier, page, &junk).map_err(fail)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Free + used = capacity per tier, every page owned exactly once, every byte as written.
    fn check<M: KvMemory>(&self, mem: &M) -> Result<(), TestCaseError> {
        for (tier, free) in [(Tier::Gpu, &self.gpu_free), (Tier::Host, &self.host_free)] {
            let capacity = SHAPE.pages(tier) as usize;
            let mut owners = vec![0u32; capacity];
            let used: Vec<u32> = self
                .requests
                .iter()
                .filter(|r| r.tier == tier)
                .flat_map(|r| r.pages.iter().copied())
                .collect();
            for &page in free.iter().chain(&used) {
                owners[page as usize] += 1;
            }
            prop_assert_eq!(
                free.len() + used.len(),
                capacity,
                "{} tier conservation",
                tier
            );
            prop_assert!(
                owners.iter().all(|&n| n == 1),
                "{} tier page owned twice: {:?}",
                tier,
                owners
            );
        }
        let mut out = vec![0; SHAPE.page_bytes];
        for request in &self.requests {
            for (&page, expected) in request.pages.iter().zip(&request.contents) {
                mem.read_page(request.tier, page, &mut out).map_err(fail)?;
                prop_assert_eq!(
                    &out,
                    expected,
                    "{} page {} of {:?}",
                    request.tier,
                    page,
                    request
                );
            }
        }
        Ok(())
    }
}

fn run<M: KvMemory>(mem: &mut M, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut harness = Harness::new();
    harness.check(mem)?;
    for op in ops {
        harness.step(mem, op)?;
        harness.check(mem)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn host_moves_match_model(ops in ops()) {
        let mut mem = HostKvStore::new(SHAPE, TABLES).unwrap();
        run(&mut mem, &ops)?;
    }

    #[test]
    fn host_layer_major_moves_match_model(ops in ops()) {
        let mut mem = HostKvStore::new(SHAPE.with_layers(3), TABLES).unwrap();
        run(&mut mem, &ops)?;
    }
}

/// The same property on the CUDA backend (fewer cases: every case allocates a store).
#[test]
fn cuda_moves_match_model() {
    cuda_property("cuda_moves_match_model", 32, ops(), |ctx, ops| {
        let mut mem = CudaKvStore::new(ctx, SHAPE, TABLES).map_err(fail)?;
        run(&mut mem, &ops)
    });
}

/// With pages the kernel takes (multiples of 16 bytes), layer-major, through each copy method.
#[test]
fn cuda_copy_methods_match_model() {
    for method in [CopyMethod::Batched, CopyMethod::Kernel { blocks: 2 }] {
        cuda_property("cuda_copy_methods_match_model", 16, ops(), |ctx, ops| {
            let mut mem = CudaKvStore::new(ctx, SHAPE.with_layers(3), TABLES).map_err(fail)?;
            mem.set_copy_method(method);
            run(&mut mem, &ops)
        });
    }
}
