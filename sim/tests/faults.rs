//! `--store-faults` and `--link-faults`: a flaky remote store and a flaky disaggregation link cost
//! recomputes and timeouts the report counts, every request still completes, and `--check` finds the
//! scheduler sound through them.

use kvsched_sim::{run, OptionsError, Report, SimError, SimOptions};

/// The shipped head of the Mooncake conversation trace, its first `n` requests.
fn trace(n: usize) -> kvsched_workload::Workload {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../data/mooncake_conversation_head.jsonl"
    );
    let mut w = kvsched_workload::load(path).expect("the shipped trace loads");
    w.arrivals.truncate(n);
    w
}

fn options() -> SimOptions {
    let mut o = SimOptions {
        check: true,
        check_every: 50,
        progress: false,
        ..SimOptions::default()
    };
    o.adapters.count = 0;
    o
}

fn store(o: &mut SimOptions) {
    o.replicas = 4;
    // Room for every block saved: the loads are the turns that meet another replica's blocks.
    o.remote_store = Some("200000".parse().expect("a store"));
}

fn ran(o: &SimOptions) -> Report {
    let r = run(o, trace(200)).expect("the cluster runs");
    assert_eq!(r.requests_completed, 200, "every request completes");
    assert_eq!(r.invariant_violations, 0, "--check finds nothing");
    assert!(r.exact_audits > 0);
    r
}

#[test]
fn a_flaky_store_costs_recomputes_and_timeouts_and_stays_sound() {
    let mut o = options();
    store(&mut o);
    let clean = ran(&o);
    assert_eq!(
        [
            clean.store_loads_failed,
            clean.store_loads_timed_out,
            clean.store_saves_timed_out
        ],
        [0, 0, 0]
    );
    o.store_faults = Some("0.4:0.4:0.3".parse().expect("store faults"));
    let flaky = ran(&o);
    assert!(flaky.store_loads_failed > 0, "{}", flaky.store_loads_failed);
    assert!(
        flaky.store_loads_timed_out > 0,
        "{}",
        flaky.store_loads_timed_out
    );
    assert!(
        flaky.store_saves_timed_out > 0,
        "{}",
        flaky.store_saves_timed_out
    );
    // Each abandoned load recompute-pauses its request.
    assert!(
        flaky.recompute_paused >= flaky.store_loads_failed + flaky.store_loads_timed_out,
        "{} recompute pauses",
        flaky.recompute_paused
    );
    let loaded = |r: &Report| r.remote.expect("store figures").blocks_loaded;
    assert!(loaded(&flaky) > 0 && loaded(&clean) > 0);
    // Seeded: the same faults again.
    let again = ran(&o);
    let figures = |r: &Report| {
        [
            r.store_loads_failed,
            r.store_loads_timed_out,
            r.store_saves_timed_out,
            r.recompute_paused,
            r.iterations,
            r.prefill_tokens,
        ]
    };
    assert_eq!(figures(&again), figures(&flaky));
}

#[test]
fn a_flaky_link_costs_recomputes_on_the_decode_engines_and_stays_sound() {
    let mut o = options();
    o.disagg = Some("2:2".parse().expect("a split"));
    let clean = ran(&o);
    assert_eq!([clean.transfers_failed, clean.transfers_timed_out], [0, 0]);
    o.link_faults = Some("0.2:0.2:100".parse().expect("link faults"));
    let flaky = ran(&o);
    assert!(flaky.transfers_failed > 0, "{}", flaky.transfers_failed);
    assert!(
        flaky.transfers_timed_out > 0,
        "{}",
        flaky.transfers_timed_out
    );
    let d = |r: &Report| r.disagg.expect("disaggregation figures");
    // Every prompt is handed over once; a failed or stalled transfer is not a delivery.
    assert_eq!(
        d(&flaky).transfers + flaky.transfers_failed + flaky.transfers_timed_out,
        d(&clean).transfers
    );
    // Each undelivered prompt is computed again on its decode engine.
    assert!(flaky.prefill_tokens > clean.prefill_tokens);
}

#[test]
fn store_and_link_faults_together_stay_sound() {
    let mut o = options();
    o.disagg = Some("2:2".parse().expect("a split"));
    o.remote_store = Some("20000".parse().expect("a store"));
    o.store_faults = Some("0.3:0.2:0.5".parse().expect("store faults"));
    o.link_faults = Some("0.3:0.3:50".parse().expect("link faults"));
    let r = ran(&o);
    assert!(r.store_loads_failed + r.transfers_failed + r.transfers_timed_out > 0);
}

#[test]
fn faults_of_a_store_or_link_the_run_lacks_are_refused() {
    let mut o = options();
    o.store_faults = Some("0.1".parse().expect("store faults"));
    let e = run(&o, trace(10)).expect_err("no store");
    assert!(matches!(
        e,
        SimError::Options(OptionsError::FaultsWithout {
            needs: "--remote-store",
            ..
        })
    ));
    let mut o = options();
    o.link_faults = Some("0.1".parse().expect("link faults"));
    let e = run(&o, trace(10)).expect_err("no link");
    assert!(matches!(
        e,
        SimError::Options(OptionsError::FaultsWithout {
            needs: "--disagg",
            ..
        })
    ));
}
