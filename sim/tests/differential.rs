//! The differential check of `--check` (issue 30): a run with the incremental pass and its twin whose
//! every pass is a full one pass through the same states, on every shipped trace; and the check does
//! fail on runs that differ.

use kvsched_sim::{differential, run, Report, SimError, SimOptions};

fn shipped(name: &str, n: usize) -> kvsched_workload::Workload {
    let path = format!("{}/../data/{name}", env!("CARGO_MANIFEST_DIR"));
    let mut w = kvsched_workload::load(&path).expect("the shipped trace loads");
    w.arrivals.truncate(n);
    w
}

fn options(check: bool) -> SimOptions {
    SimOptions {
        check,
        check_every: 100,
        progress: false,
        ..SimOptions::default()
    }
}

#[test]
fn every_shipped_trace_replays_its_steady_passes_as_the_full_pass_does() {
    for name in [
        "azure_conv_head.csv",
        "azure_code_head.csv",
        "burstgpt1_head54.csv",
        "mooncake_conversation_head.jsonl",
        "mooncake_synthetic_head.jsonl",
    ] {
        let r = run(&options(true), shipped(name, 300)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.invariant_violations, 0, "{name}");
        assert_eq!(r.differential_passes, Some(r.iterations), "{name}");
        assert!(r.incremental_passes > 0, "{name}: no pass was incremental");
        // Without --check there is no twin, and the figures are the same run's.
        let plain = run(&options(false), shipped(name, 300)).expect("runs");
        assert_eq!(plain.differential_passes, None);
        assert_eq!(
            (
                plain.iterations,
                plain.incremental_passes,
                plain.tokens_generated
            ),
            (r.iterations, r.incremental_passes, r.tokens_generated),
            "{name}"
        );
    }
}

#[test]
fn full_passes_only_run_no_incremental_pass_and_schedule_the_same() {
    let w = shipped("azure_conv_head.csv", 300);
    let full = run(
        &SimOptions {
            full_passes: true,
            ..options(false)
        },
        w.clone(),
    )
    .expect("runs");
    let incremental = run(&options(false), w).expect("runs");
    assert_eq!(full.incremental_passes, 0);
    assert!(incremental.incremental_passes > 0);
    assert_eq!(
        (full.iterations, full.tokens_generated, full.ttft_ms.p99),
        (
            incremental.iterations,
            incremental.tokens_generated,
            incremental.ttft_ms.p99
        )
    );
}

/// Runs whose passes differ (another seed: other adapters) fail the check at the first pass that
/// differs; a run checked against itself passes.
#[test]
fn the_check_fails_on_a_pass_that_differs() {
    let digests = |seed: u64| -> Report {
        let o = SimOptions {
            seed,
            full_passes: true,
            ..options(false)
        };
        run(&o, shipped("azure_conv_head.csv", 200)).expect("runs")
    };
    let (a, b) = (digests(1), digests(2));
    assert!(!a.digests.is_empty());
    assert_eq!(differential(&a, &digests(1)), Ok(()));
    match differential(&a, &b) {
        Err(SimError::Differential { pass, .. }) => {
            assert!(pass >= 1 && pass as usize <= a.digests.len().max(b.digests.len()));
        }
        other => panic!("runs of other seeds compared equal: {other:?}"),
    }
}
