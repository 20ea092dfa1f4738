//! Zero allocations per iteration, counted: a counting global allocator watches 10,000 iterations of every
//! bench scenario of `shared/bench/SCENARIOS.md` (`kvsched_bench`; S4: 2,500 in a debug build, see
//! [`S4_ITERS_DEBUG`]). Building a scenario's state is excluded: the counter is read right before and
//! right after each iteration.
//!
//! `kvsched_bench::CountingAlloc` counts per thread (a `const`-initialised thread-local, which never allocates), so two
//! workers can share the scenarios (the reset scenarios rebuild their state before every iteration, which
//! is slow in a debug build) without one worker's rebuilds landing in the other's window. An allocation
//! made by the pass runs on the thread that runs the pass, so it is counted.
//!
//! The depth family (`kvsched_bench::depth`): every steady pass of one built state of each scenario
//! (`DEPTH_PASSES - 1`); a debug build checks the 1k queues over the 100k-block cache (a 64k state
//! takes its debug build minutes), `cargo test --release` every scenario.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use kvsched_bench::depth::{Depth, DepthBench, CACHE_100K, DEPTH_PASSES};
use kvsched_bench::{allocations, dispatch, Bench, CountingAlloc, Scenario, Visit};
use kvsched_core::storage::Boxed;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Iterations per scenario.
const ITERS: u64 = 10_000;
/// S4 rebuilds 1024 requests, 32,800 KV pages and 64 adapters before every iteration: about 4 ms in a
/// debug build, so a debug run (plain `cargo test`) checks fewer of its iterations; `cargo test --release`
/// checks all 10,000.
const S4_ITERS_DEBUG: u64 = 2_500;

fn iterations(s: Scenario) -> u64 {
    if s == Scenario::S4 && cfg!(debug_assertions) {
        S4_ITERS_DEBUG
    } else {
        ITERS
    }
}
/// Worker threads.
const WORKERS: usize = 2;

struct Count;

impl Visit for Count {
    type Out = (u64, u64);
    fn visit<const N: usize, const T: usize>(&mut self, s: Scenario) -> (u64, u64) {
        let (mut counted, mut ran) = (0u64, 0u64);
        // Boxed: the scheduler's arrays on the heap, so a test thread's stack builds any `N` (the
        // benches measure the inline storage; `kvsched bench` counts its allocations too).
        Bench::<N, T, Boxed>::drive(s, iterations(s), |b, k| {
            for _ in 0..k {
                let before = allocations();
                b.iteration();
                counted += allocations() - before;
                ran += 1;
            }
        });
        (counted, ran)
    }
}

#[test]
fn the_counter_sees_allocations() {
    let before = allocations();
    let v = std::hint::black_box(vec![1u8; 3]);
    assert!(allocations() > before);
    drop(v);
}

#[test]
fn bench_iterations_do_not_allocate() {
    // The slowest scenario first, so the two workers finish together.
    let mut order = Scenario::ALL.to_vec();
    order.sort_by_key(|s| std::cmp::Reverse(*s == Scenario::S4));
    let next = AtomicUsize::new(0);
    let report = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..WORKERS {
            std::thread::Builder::new()
                .spawn_scoped(scope, || {
                    while let Some(&s) = order.get(next.fetch_add(1, Ordering::SeqCst)) {
                        let t = std::time::Instant::now();
                        let (counted, ran) = dispatch(s, &mut Count);
                        eprintln!(
                            "{}: {ran} iterations, {counted} allocations, {:.1?}",
                            s.name(),
                            t.elapsed()
                        );
                        report.lock().unwrap().push((s, counted, ran));
                    }
                })
                .expect("spawn");
        }
    });
    let report = report.into_inner().unwrap();
    assert_eq!(report.len(), Scenario::ALL.len());
    for (s, counted, ran) in &report {
        assert_eq!(*ran, iterations(*s), "{}: iterations run", s.name());
        assert_eq!(*counted, 0, "{}: allocations in {ran} iterations", s.name());
    }
}

#[test]
fn depth_iterations_do_not_allocate() {
    let debug = cfg!(debug_assertions);
    let which = Depth::ALL
        .into_iter()
        .filter(|d| !debug || (d.waiting <= 1_024 && d.conversations == CACHE_100K));
    for d in which {
        let t = std::time::Instant::now();
        let mut b = DepthBench::build(d);
        let (mut counted, mut ran) = (0u64, 0u32);
        while !b.spent() {
            let before = allocations();
            b.iteration();
            counted += allocations() - before;
            ran += 1;
        }
        eprintln!(
            "{}: {ran} iterations, {counted} allocations, {:.1?}",
            d.name,
            t.elapsed()
        );
        assert_eq!(ran, DEPTH_PASSES - 1, "{}: iterations run", d.name);
        assert_eq!(counted, 0, "{}: allocations in {ran} iterations", d.name);
    }
}
