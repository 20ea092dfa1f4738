//! Wall-clock benchmarks (criterion) of one scheduling iteration for every scenario of
//! `shared/bench/SCENARIOS.md`, and of the floor pass over the same requests.
//!
//! `cargo bench -p kvsched-bench --bench iteration` (add `-- S1` to filter). Reset scenarios rebuild their state before
//! every iteration outside the timed region (`iter_custom`); S1 times runs of up to
//! `kvsched_bench::S1_PASSES` consecutive iterations between (untimed) rebuilds.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use kvsched_bench::{dispatch, Bench, Scenario, Visit};

struct Group<'a> {
    c: &'a mut Criterion,
}

impl Visit for Group<'_> {
    type Out = ();
    fn visit<const N: usize, const T: usize>(&mut self, s: Scenario) {
        let mut g = self.c.benchmark_group(s.name());
        if s.resets() {
            // Building the state costs more than the iteration: keep the wall time bounded.
            g.sample_size(30);
            g.measurement_time(Duration::from_secs(2));
        } else {
            g.measurement_time(Duration::from_secs(3));
        }
        g.warm_up_time(Duration::from_millis(500));
        g.bench_function("iteration", |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                Bench::<N, T>::drive(s, iters, |bench, k| {
                    let t = Instant::now();
                    for _ in 0..k {
                        bench.iteration();
                    }
                    timed += t.elapsed();
                });
                timed
            });
        });
        let bench = Bench::<N, T>::build(s);
        g.bench_function("floor", |b| b.iter(|| black_box(bench.floor())));
        drop(bench);
        g.finish();
    }
}

fn scenarios(c: &mut Criterion) {
    for s in Scenario::ALL {
        dispatch(s, &mut Group { c });
    }
}

criterion_group!(benches, scenarios);
criterion_main!(benches);
