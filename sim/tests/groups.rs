//! The simulator on KV groups: the full-only-against-grouped sweep in small (grouped runs more
//! requests at once beyond the window, exactly as many within it), a grouped run whose window pool
//! could never hold a whole request (under GUARANTEED_NO_EVICT too), prefix reuse across the groups,
//! and the refusals.

use kvsched_core::config::CapacityPolicy;
use kvsched_sim::groups::{
    GroupsSweep, GroupsUnsupported, KvGroupsOptions, Layout, GEMMA3_12B, GEMMA3_27B,
};
use kvsched_sim::{OptionsError, SimError, SimOptions};

/// A small sweep of Gemma 3 27B: 48 requests of 128 output tokens, two contexts within the
/// 1,024-token window and one well beyond it.
fn small() -> GroupsSweep {
    let mut s = GroupsSweep::new(GEMMA3_27B);
    s.contexts = vec![512, 1024, 8192];
    s.requests = 48;
    s.output_tokens = 128;
    s
}

#[test]
fn grouped_runs_more_requests_beyond_the_window_and_the_same_within_it() {
    let rows = small().run().expect("the sweep runs");
    for r in &rows {
        for p in [&r.full_only, &r.grouped] {
            assert_eq!(p.report.requests_completed, 48, "context {}", r.context);
        }
    }
    // Within the window nothing is released: the same pools, the same runs.
    for r in &rows[..2] {
        let (f, g) = (&r.full_only, &r.grouped);
        assert_eq!(f.sizing.full_pages, g.sizing.full_pages, "{}", r.context);
        assert_eq!(f.sizing.full_pages, g.sizing.window_pages, "{}", r.context);
        assert_eq!(f.sizing.fits, g.sizing.fits, "{}", r.context);
        assert_eq!(f.peak_batch, g.peak_batch, "{}", r.context);
        assert_eq!(f.burst_throughput_tok_s, g.burst_throughput_tok_s);
        assert_eq!(f.report.goodput_rps, g.report.goodput_rps);
        assert_eq!(f.report.ttft_ms, g.report.ttft_ms);
    }
    // Beyond it the window group holds 33 pages a request: several times the requests fit and run.
    let (f, g) = (&rows[2].full_only, &rows[2].grouped);
    assert!(
        g.sizing.fits >= 3 * f.sizing.fits,
        "{:?} {:?}",
        f.sizing,
        g.sizing
    );
    assert!(
        g.peak_batch > f.peak_batch + 10,
        "{} {}",
        f.peak_batch,
        g.peak_batch
    );
    assert!(g.burst_throughput_tok_s > f.burst_throughput_tok_s);
    assert!(g.report.goodput_rps >= f.report.goodput_rps);
    assert!(kvsched_sim::groups::table(&rows).contains("| 8192 |"));
}

/// GUARANTEED_NO_EVICT on groups: each group reserves what a request holds there at most (a window
/// group its window and a chunk, 65 pages here, then its window and a step), so the same 24 long
/// requests run in the same small window pool, nothing suspended, paused or preempted, the core's
/// checks clean every iteration.
#[test]
fn guaranteed_no_evict_reserves_windows_in_the_window_pool() {
    let s = small();
    let (mut o, _) = s.options(Layout::Grouped, 8192);
    o.kv_groups = Some(KvGroupsOptions {
        window: 1024,
        window_gpu_pages: 400,
        window_host_pages: 0,
    });
    o.policy = CapacityPolicy::GuaranteedNoEvict;
    o.slo_ttft_ms = None;
    o.check = true;
    o.check_every = 1;
    o.max_tokens = 1024;
    let r = kvsched_sim::run(&o, long_requests(24)).expect("it runs");
    assert_eq!(r.requests_completed, 24);
    assert_eq!(r.invariant_violations, 0);
    let evicted = r.suspended + r.self_evicted + r.recompute_paused + r.preempted;
    assert_eq!(evicted, 0);
    // 400 window pages hold six prefilling requests' 65-page reservations at once (reserving whole
    // requests, 256 pages each, they would hold one).
    let peak = r.samples.batch.iter().copied().fold(0.0, f64::max);
    assert!(peak >= 6.0, "{peak}");
}

/// `n` requests of 8,064 prompt and 128 output tokens, arriving at 100 a second.
fn long_requests(n: usize) -> kvsched_workload::Workload {
    kvsched_workload::synthetic::generate(&kvsched_workload::synthetic::SyntheticSpec {
        arrivals: kvsched_workload::synthetic::ArrivalProcess::Poisson { rate_per_s: 100.0 },
        horizon: kvsched_workload::synthetic::Horizon::Requests(n),
        prompt: kvsched_workload::synthetic::LengthDist::Uniform { lo: 8064, hi: 8065 },
        output: kvsched_workload::synthetic::LengthDist::Uniform { lo: 128, hi: 129 },
        seed: 3,
    })
    .expect("a workload")
}

#[test]
fn the_window_pool_holds_windows_not_requests() {
    // 24 requests of 8,192 tokens, each 256 pages in full: the window group's 400 pages could hold
    // one whole request only, but as windows of 33 pages they hold about a dozen.
    let s = small();
    let (mut o, sizing) = s.options(Layout::Grouped, 8192);
    assert!(sizing.window_pages > 400);
    o.kv_groups = Some(KvGroupsOptions {
        window: 1024,
        window_gpu_pages: 400,
        window_host_pages: 0,
    });
    o.slo_ttft_ms = None;
    o.check = true;
    o.check_every = 1;
    // Chunks of at most 1,024 tokens: a prefilling request holds (1,024 + 1,024) / 32 + 1 pages there.
    o.max_tokens = 1024;
    let r = kvsched_sim::run(&o, long_requests(24)).expect("it runs");
    assert_eq!(r.requests_completed, 24);
    assert_eq!(r.invariant_violations, 0);
    let peak = r.samples.batch.iter().copied().fold(0.0, f64::max);
    assert!(peak >= 8.0, "{peak}");
}

#[test]
fn prefixes_are_reused_across_the_groups() {
    // Multi-turn sessions over system prompts (`workload::sessions`): prompts up to about 1,500 tokens
    // against a 256-token window, so most hits need the window group's last window.
    let w = kvsched_workload::synthetic::generate(
        &kvsched_workload::synthetic::SyntheticSpec::slora(2.0, 1.0, 30.0, 5),
    )
    .expect("a workload");
    let full = SimOptions {
        kv_gpu_pages: 4000,
        kv_host_pages: 0,
        check: true,
        progress: false,
        ..SimOptions::default()
    };
    let grouped = SimOptions {
        kv_groups: Some(KvGroupsOptions {
            window: 256,
            window_gpu_pages: 4000,
            window_host_pages: 0,
        }),
        ..full.clone()
    };
    let f = kvsched_sim::run(&full, w.clone()).expect("full-only runs");
    let g = kvsched_sim::run(&grouped, w).expect("grouped runs");
    for r in [&f, &g] {
        assert_eq!(r.requests_completed, 60);
        assert_eq!(r.invariant_violations, 0);
    }
    // The window rule can only shorten a hit; here every window's blocks stay cached (idle in a
    // window cache that evicts nothing), so it does not.
    assert!(g.prefix_hit_rate > 0.3, "{}", g.prefix_hit_rate);
    assert_eq!(g.prefix_hit_rate, f.prefix_hit_rate);
}

#[test]
fn the_sizing_follows_the_layer_pattern() {
    // 62 layers x 2 x 16 heads x 128 x 2 bytes; 10 global.
    assert_eq!(GEMMA3_27B.full_bytes_per_token(), 81_920);
    assert_eq!(GEMMA3_27B.window_bytes_per_token(), 425_984);
    assert_eq!(GEMMA3_12B.full_bytes_per_token(), 65_536);
    let budget = GEMMA3_27B.h200_kv_budget_bytes();
    // 0.9 x 143,771 MiB - 54.8 GB.
    assert!((budget / 1e9 - 80.88).abs() < 0.01, "{budget}");
    let f = GEMMA3_27B.size(Layout::FullOnly, budget, 32, 32_768, 8192);
    let g = GEMMA3_27B.size(Layout::Grouped, budget, 32, 32_768, 8192);
    assert_eq!((f.full_pages, f.fits), (4976, 4));
    // The window group: one step's chunks (8,192 tokens: 256 pages), then 33 pages a request.
    assert_eq!((g.window_pages - 256) / 33, g.full_pages / 1024);
    assert_eq!(g.fits, 24, "{g:?}");
    // Both pools of the split take the whole budget.
    let bytes =
        f64::from(g.full_pages) * 81_920.0 * 32.0 + f64::from(g.window_pages) * 425_984.0 * 32.0;
    assert!(
        bytes <= budget && bytes > 0.999 * budget,
        "{bytes} {budget}"
    );
}

/// Sets one option.
type Set = fn(&mut SimOptions);

#[test]
fn features_groups_do_not_support_are_refused() {
    let s = small();
    let (base, _) = s.options(Layout::Grouped, 4096);
    let w = kvsched_workload::synthetic::generate(
        &kvsched_workload::synthetic::SyntheticSpec::slora(1.0, 1.0, 4.0, 1),
    )
    .expect("a workload");
    let refused = |o: &SimOptions| match kvsched_sim::run(o, w.clone()) {
        Err(SimError::Options(e)) => e,
        other => panic!("not refused: {:?}", other.map(|r| r.requests_completed)),
    };
    let cases: [(Set, GroupsUnsupported); 5] = [
        (
            |o| {
                o.spec_decode = Some(kvsched_sim::SpecDecode {
                    drafts: 2,
                    accept: 0.5,
                });
            },
            GroupsUnsupported::SpecDecode,
        ),
        (
            |o| o.remote_store = Some("64".parse().expect("a store")),
            GroupsUnsupported::Connector,
        ),
        (
            |o| o.disagg = Some("1:1".parse().expect("disaggregation")),
            GroupsUnsupported::Disaggregation,
        ),
        (|o| o.replicas = 2, GroupsUnsupported::Replicas),
        (
            |o| {
                o.adapters.count = 2;
                o.adapters.unified = true;
            },
            GroupsUnsupported::UnifiedAdapters,
        ),
    ];
    for (set, feature) in cases {
        let mut o = base.clone();
        set(&mut o);
        assert_eq!(refused(&o), OptionsError::GroupsUnsupported(feature));
        assert!(refused(&o).to_string().contains("KV groups do not support"));
    }
    let mut o = base.clone();
    o.kv_groups = Some(KvGroupsOptions {
        window: 1000,
        window_gpu_pages: 1000,
        window_host_pages: 0,
    });
    assert!(matches!(
        refused(&o),
        OptionsError::GroupWindow { window: 1000, .. }
    ));
    o.kv_groups = Some(KvGroupsOptions {
        window: 1024,
        window_gpu_pages: 4,
        window_host_pages: 0,
    });
    assert!(matches!(
        refused(&o),
        OptionsError::WindowPoolTooSmall { pages: 4, .. }
    ));
}
