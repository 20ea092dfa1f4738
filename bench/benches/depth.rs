//! Instruction counts (gungraun, callgrind) of the steady pass at the deepest queue the table allows
//! (`kvsched_bench::depth`, 65,471 waiting requests): the 64k scenarios of the depth family, whose
//! 1k and 16k ones are in `instructions.rs`'s `depth` group (and the instruction gate), and the
//! queues over the 10M-block cache. These are apart because building a 64k state (its 104M block
//! hashes submitted, its first pass matching every prompt from the root) or filling 10M blocks takes
//! minutes each under callgrind: `cargo bench -p kvsched-bench --bench depth` runs them by hand
//! (docs/BENCH.md, "The pass at depth: the bench family").
//!
//! As in `instructions.rs`: the state is built and its first pass run outside the measured
//! function, which runs the steady pass after it (asserted), and returns the state so that tearing
//! it down is not counted.

use gungraun::{library_benchmark, library_benchmark_group, main};
use kvsched_bench::depth::{Depth, DepthBench};

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

depth!(depth_64k, "depth-64k");
depth!(depth_1k_10m, "depth-1k-10M");
depth!(depth_64k_10m, "depth-64k-10M");
depth!(shared_64k, "shared-64k");
depth!(unique_64k, "unique-64k");
depth!(evicting_64k, "evicting-64k");

library_benchmark_group!(
    name = deep,
    benchmarks = [
        depth_64k,
        depth_1k_10m,
        depth_64k_10m,
        shared_64k,
        unique_64k,
        evicting_64k
    ]
);

main!(library_benchmark_groups = deep);
