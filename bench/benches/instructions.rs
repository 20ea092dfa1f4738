//! Instruction counts (gungraun, callgrind) of one scheduling iteration for every scenario of
//! `shared/bench/SCENARIOS.md`, and of the floor pass over the same requests: deterministic figures fit
//! for a CI gate. `cargo bench -p kvsched-bench --bench instructions` (needs valgrind and `gungraun-runner` 0.20.0).
//!
//! Each benchmark gets a freshly built state (built outside the measured function: the scheduler over
//! pools that own their buffers) and runs exactly one iteration, which asserts its outcome: the first
//! pass, a full one (`iteration`); the pass after it, which keeps the steady decode batch
//! (`incremental`, the not-reset scenarios). The state is returned so that tearing it down is not
//! counted either.

use std::hint::black_box;

use gungraun::{library_benchmark, library_benchmark_group, main};
use kvsched_bench::depth::{Depth, DepthBench};
use kvsched_bench::{Bench, Scenario};

macro_rules! scenario {
    ($iter:ident, $floor:ident, $s:expr, $n:literal, $t:literal) => {
        #[library_benchmark]
        #[bench::first(Bench::<$n, $t>::build($s))]
        fn $iter(mut b: Bench<$n, $t>) -> Bench<$n, $t> {
            b.iteration();
            b
        }

        #[library_benchmark]
        #[bench::start(Bench::<$n, $t>::build($s))]
        fn $floor(b: Bench<$n, $t>) -> (u64, Bench<$n, $t>) {
            (black_box(b.floor()), b)
        }
    };
}

/// The incremental pass: a state built and iterated once (its first pass, a full one, leaves a steady
/// decode batch), then the measured iteration, which replays it (asserted).
macro_rules! steady {
    ($iter:ident, $s:expr, $n:literal, $t:literal) => {
        #[library_benchmark]
        #[bench::steady(Bench::<$n, $t>::steady($s))]
        fn $iter(mut b: Bench<$n, $t>) -> Bench<$n, $t> {
            b.iteration();
            b
        }
    };
}

steady!(s1_64_incremental, Scenario::S1_64, 64, 8);
steady!(s1_256_incremental, Scenario::S1_256, 256, 8);
steady!(s1_1024_incremental, Scenario::S1_1024, 1024, 8);
steady!(s6_incremental, Scenario::S6, 256, 8);

/// The pass at depth (`kvsched_bench::depth`): a state built and its first pass run (every waiting
/// first chunk tried and refused), then the measured iteration, the steady pass after it. The 1k and
/// 16k queues (about 30 s each to build under callgrind); the 64k ones are `benches/depth.rs`'s.
macro_rules! depth {
    ($iter:ident, $name:literal) => {
        #[library_benchmark]
        #[bench::steady(DepthBench::build(Depth::parse($name).expect("a depth scenario")))]
        fn $iter(mut b: DepthBench) -> DepthBench {
            b.iteration();
            b
        }
    };
}

depth!(depth_1k, "depth-1k");
depth!(depth_16k, "depth-16k");
depth!(shared_1k, "shared-1k");
depth!(unique_1k, "unique-1k");
depth!(evicting_1k, "evicting-1k");
depth!(evicting_16k, "evicting-16k");

scenario!(s1_64, s1_64_floor, Scenario::S1_64, 64, 8);
scenario!(s1_256, s1_256_floor, Scenario::S1_256, 256, 8);
scenario!(s1_1024, s1_1024_floor, Scenario::S1_1024, 1024, 8);
scenario!(s2, s2_floor, Scenario::S2, 320, 8);
scenario!(s3, s3_floor, Scenario::S3, 256, 8);
scenario!(s3s, s3s_floor, Scenario::S3s, 256, 8);
scenario!(s3h, s3h_floor, Scenario::S3h, 256, 8);
scenario!(s4, s4_floor, Scenario::S4, 1024, 64);
scenario!(s5, s5_floor, Scenario::S5, 320, 8);
scenario!(s6, s6_floor, Scenario::S6, 256, 8);
scenario!(s7, s7_floor, Scenario::S7, 320, 8);

library_benchmark_group!(
    name = iteration,
    benchmarks = [s1_64, s1_256, s1_1024, s2, s3, s3s, s3h, s4, s5, s6, s7]
);
library_benchmark_group!(
    name = floor,
    benchmarks = [
        s1_64_floor,
        s1_256_floor,
        s1_1024_floor,
        s2_floor,
        s3_floor,
        s3s_floor,
        s3h_floor,
        s4_floor,
        s5_floor,
        s6_floor,
        s7_floor
    ]
);

library_benchmark_group!(
    name = incremental,
    benchmarks = [
        s1_64_incremental,
        s1_256_incremental,
        s1_1024_incremental,
        s6_incremental
    ]
);

library_benchmark_group!(
    name = depth,
    benchmarks = [
        depth_1k,
        depth_16k,
        shared_1k,
        unique_1k,
        evicting_1k,
        evicting_16k
    ]
);

main!(
    library_benchmark_groups = iteration,
    floor,
    incremental,
    depth
);
