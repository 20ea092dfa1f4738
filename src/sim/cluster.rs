//! `--replicas N --route …`: the same workload on `N` engines behind a router, each engine with its own
//! scheduler and pools, in one process and deterministic for a seed.
//!
//! The router assigns every request as it arrives: `round_robin` in turn; `prefix_affinity` by the
//! first of its prefix blocks that few other requests share — past a system prompt every request
//! starts with, the block that names its conversation (a Mooncake `hash_ids` list, or a generated
//! session) — so that the turns of one conversation meet the replica that cached the earlier ones.
//! Both decide from the requests alone, so the replicas then run independently, one after the other,
//! and the wall time grows linearly with them. (A load-aware route and a store shared by the replicas
//! couple them in time; they are not built yet.)
//!
//! The report is the cluster's: counters summed, TTFT and TPOT quantiles over every request, the time
//! from the first arrival to the last replica's end; and one row per replica.

use super::report::{Quantiles, ReplicaRow};
use super::{engine, Report, SimError, SimOptions};
use crate::workload::Workload;

/// How the router spreads requests over the replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Route {
    /// In turn.
    #[default]
    #[value(name = "round_robin")]
    RoundRobin,
    /// By the request's first prefix block (requests without one: in turn).
    #[value(name = "prefix_affinity")]
    PrefixAffinity,
}

impl Route {
    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::RoundRobin => "round_robin",
            Self::PrefixAffinity => "prefix_affinity",
        }
    }
}

/// The replica each arrival of `w` goes to.
pub fn assign(w: &Workload, replicas: u32, route: Route) -> Vec<u32> {
    let n = u64::from(replicas.max(1));
    // How many requests start with each block (a shared system prompt: nearly all of them).
    let mut sharing: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    if route == Route::PrefixAffinity {
        for a in &w.arrivals {
            for &b in &a.prefix_blocks {
                *sharing.entry(b).or_default() += 1;
            }
        }
    }
    // A conversation's key: its first block shared by no more than a replica's share of requests.
    let share = (w.arrivals.len() as u64 / n).max(1) as usize;
    let mut turn = 0u64;
    let mut next = || {
        turn += 1;
        ((turn - 1) % n) as u32
    };
    w.arrivals
        .iter()
        .map(|a| {
            let key = a
                .prefix_blocks
                .iter()
                .find(|b| sharing.get(b).is_some_and(|&c| c <= share))
                .or(a.prefix_blocks.last());
            match (route, key) {
                // A well-mixed hash of the block id, so neighbouring ids spread.
                (Route::PrefixAffinity, Some(&b)) => {
                    (kvsched_core::page_pool::chain(0, b) % n) as u32
                }
                _ => next(),
            }
        })
        .collect()
}

/// Runs `w` (adapters and sessions assigned) on `o.replicas` engines behind `o.route`.
pub fn run(o: &SimOptions, w: Workload) -> Result<Report, SimError> {
    let replicas = o.replicas.max(1);
    let to = assign(&w, replicas, o.route);
    let start_ms = w.arrivals.first().map_or(0.0, |a| a.at_ms);
    let mut reports = Vec::with_capacity(replicas as usize);
    for k in 0..replicas {
        let part = Workload {
            arrivals: w
                .arrivals
                .iter()
                .zip(&to)
                .filter(|(_, &r)| r == k)
                .map(|(a, _)| a.clone())
                .collect(),
            source: w.source.clone(),
            dropped_rows: 0,
            prefix_block_tokens: w.prefix_block_tokens,
        };
        let part_start = part.arrivals.first().map_or(start_ms, |a| a.at_ms);
        let r = if part.arrivals.is_empty() {
            Report::default()
        } else {
            engine(o, part).map_err(|e| SimError::Scheduler(format!("replica {k}: {e}")))?
        };
        reports.push((part_start - start_ms, r));
    }
    Ok(merge(o, &w, reports))
}

/// The cluster's report from the replicas' (each with its start after the first arrival, in ms).
fn merge(o: &SimOptions, w: &Workload, reports: Vec<(f64, Report)>) -> Report {
    let mut c = Report {
        source: w.source.to_string(),
        requests_total: w.arrivals.len(),
        engine: o.engine.to_string(),
        slo_ttft_ms: o.slo_ttft_ms,
        slo_tpot_ms: o.slo_tpot_ms,
        prefix_reuse: o.prefix_reuse,
        admission: super::admission_name(o.admission).into(),
        adapter_paging: if o.adapters.unified {
            "unified"
        } else {
            "split"
        }
        .into(),
        adapters: o.adapters.count,
        route: o.route.name().into(),
        ..Report::default()
    };
    let (mut ttft, mut tpot, mut sched) = (Vec::new(), Vec::new(), Vec::new());
    let n = reports.len().max(1) as f64;
    for (k, (offset_ms, r)) in reports.iter().enumerate() {
        macro_rules! sum {
            ($($f:ident),*) => { $( c.$f += r.$f; )* };
        }
        sum!(
            requests_completed,
            tokens_generated,
            completed_output_tokens,
            prefill_tokens,
            suspended,
            self_evicted,
            recompute_paused,
            preempted,
            resumed,
            pages_offloaded,
            pages_reloaded,
            adapter_loads,
            adapter_evictions,
            iterations,
            decode_steps,
            accepted_drafts,
            slo_met,
            admitted_prompt_tokens,
            admitted_reused_tokens,
            prefill_tokens_saved,
            cached_blocks_evicted,
            cached_blocks_demoted,
            host_cache_hits,
            invariant_violations
        );
        c.wall_seconds += r.wall_seconds;
        c.sim_seconds = c.sim_seconds.max(offset_ms / 1000.0 + r.sim_seconds);
        c.kv_gpu_util_mean_pct += r.kv_gpu_util_mean_pct / n;
        c.adapter_util_mean_pct += r.adapter_util_mean_pct / n;
        c.kv_gpu_util_peak_pct = c.kv_gpu_util_peak_pct.max(r.kv_gpu_util_peak_pct);
        c.kv_host_util_peak_pct = c.kv_host_util_peak_pct.max(r.kv_host_util_peak_pct);
        c.spec_drafts = r.spec_drafts;
        ttft.extend_from_slice(&r.raw.ttft);
        tpot.extend_from_slice(&r.raw.tpot);
        sched.extend_from_slice(&r.raw.sched_ns);
        c.replicas.push(ReplicaRow {
            replica: k as u32,
            requests: r.requests_total,
            throughput_tok_s: r.throughput_tok_s,
            ttft_ms: r.ttft_ms,
            prefix_hit_rate: r.prefix_hit_rate,
            kv_gpu_util_peak_pct: r.kv_gpu_util_peak_pct,
        });
    }
    for v in [&mut ttft, &mut tpot, &mut sched] {
        v.sort_by(f64::total_cmp);
    }
    (c.ttft_ms, c.tpot_ms) = (Quantiles::of(&ttft), Quantiles::of(&tpot));
    c.sched_ns_per_iter = Quantiles::of(&sched);
    c.prefix_hit_rate = if c.admitted_prompt_tokens > 0 {
        c.admitted_reused_tokens as f64 / c.admitted_prompt_tokens as f64
    } else {
        0.0
    };
    let start = w.arrivals.first().map_or(0.0, |a| a.at_ms);
    c.arrival_span_seconds = w
        .arrivals
        .last()
        .map_or(0.0, |a| (a.at_ms - start).max(0.0) / 1000.0);
    c.raw.ttft = ttft;
    c.raw.tpot = tpot;
    c.derive();
    c
}
