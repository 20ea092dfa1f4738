//! `--route kv`: the KV-aware router fed by the replicas' KV events knows what each replica caches —
//! exactly, pass after pass, through commits, demotions to the host tier, reloads and evictions —
//! and sends a prompt where its prefix is.

use kvsched_sim::cluster::Route;
use kvsched_sim::{run, Report, SimOptions};

/// The shipped head of the Mooncake synthetic trace (long shared prefixes), its first `n` requests.
fn trace(n: usize) -> kvsched_workload::Workload {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../data/mooncake_synthetic_head.jsonl"
    );
    let mut w = kvsched_workload::load(path).expect("the shipped trace loads");
    w.arrivals.truncate(n);
    w
}

/// Four replicas of small pools (512-token pages: one a trace block), so that blocks are demoted,
/// reloaded and evicted, under `route` and `--check`.
fn small(route: Route) -> SimOptions {
    let mut o = SimOptions::default();
    o.adapters.count = 0;
    o.tokens_per_block = 512;
    o.kv_gpu_pages = 300;
    o.kv_host_pages = 120;
    o.replicas = 4;
    o.route = route;
    o.check = true;
    // The router's view is compared at every exact audit: after every step here.
    o.check_every = 1;
    o.progress = false;
    o
}

fn ran(o: &SimOptions, n: usize) -> Report {
    run(o, trace(n)).expect("the cluster runs")
}

#[test]
fn the_router_knows_each_replicas_cache_through_demotions_and_evictions() {
    let r = ran(&small(Route::Kv), 120);
    assert_eq!(r.requests_completed, 120);
    // The check compares, after every step, what the router learnt from a replica's events with
    // the blocks its prefix cache holds in each tier.
    assert_eq!(r.invariant_violations, 0);
    assert!(r.cached_blocks_demoted > 0, "{}", r.cached_blocks_demoted);
    assert!(r.cached_blocks_evicted > 0, "{}", r.cached_blocks_evicted);
    assert!(r.host_cache_hits > 0, "{}", r.host_cache_hits);
    // The host tier full of prefix cache was reported as "host utilization peak 0.0 %" (issue 43):
    // requests' pages and cached blocks are told apart.
    assert!(
        r.kv_host_cached_peak_pct > 0.0,
        "{}",
        r.kv_host_cached_peak_pct
    );
}

#[test]
fn routing_by_the_cache_hits_more_and_waits_less_than_by_turns_or_load() {
    let mut o = small(Route::Kv);
    o.check = false;
    o.kv_gpu_pages = 2000;
    let kv = ran(&o, 300);
    for route in [Route::RoundRobin, Route::LeastLoaded] {
        o.route = route;
        let d = ran(&o, 300);
        let name = route.name();
        assert!(
            kv.prefix_hit_rate > d.prefix_hit_rate,
            "{name}: {} vs {}",
            kv.prefix_hit_rate,
            d.prefix_hit_rate
        );
        assert!(
            kv.ttft_ms.p50 < d.ttft_ms.p50,
            "{name}: {:?} vs {:?}",
            kv.ttft_ms,
            d.ttft_ms
        );
    }
    // With the overlap weighing nothing, the router balances load only.
    o.route = Route::Kv;
    o.kv_overlap_weight = 0.0;
    assert!(ran(&o, 300).prefix_hit_rate < kv.prefix_hit_rate);
    o.kv_overlap_weight = -1.0;
    assert!(run(&o, trace(10)).is_err(), "a negative weight is refused");
}

#[test]
fn disaggregated_the_router_routes_the_prefill_engines_by_their_events() {
    let mut o = small(Route::Kv);
    o.replicas = 1;
    o.disagg = Some("2:2".parse().expect("a split"));
    let r = ran(&o, 60);
    assert_eq!(r.requests_completed, 60);
    assert_eq!(
        r.invariant_violations, 0,
        "the prefill engines' views agree"
    );
    let roles: Vec<&str> = r.replicas.iter().map(|x| x.role.as_str()).collect();
    assert_eq!(roles, ["prefill", "prefill", "decode", "decode"]);
}
