//! `--replicas N --route …`: the same workload on `N` engines behind a router, each engine with its own
//! scheduler and pools, in one process and deterministic for a seed.
//!
//! The router assigns every request as it arrives: `round_robin` in turn; `least_loaded` to the
//! replica with the fewest requests outstanding (held, queued or sent and not yet admitted);
//! `prefix_affinity` by the first of its prefix blocks that few other requests share — past a system
//! prompt every request starts with, the block that names its conversation (a Mooncake `hash_ids`
//! list, or a generated session) — so that the turns of one conversation meet the replica that cached
//! the earlier ones.
//!
//! With `--remote-store PAGES` the replicas share an in-process KV store (`RemoteStore`), each
//! engine's pool attached to it through the core's KV connector: a first chunk is offered the blocks
//! the store holds past the engine's own prefix cache, loads them over the network (latency plus pages
//! over bandwidth, added to the step), and every prompt block committed to the engine's cache is saved
//! to the store (the connector's save, its pages pinned until the write is acknowledged). The store is the model the scheduling rules are tested against, not a distributed
//! system: capacity in pages, least recently used eviction, a block visible to other replicas from the
//! simulated time of the pass whose step computed it.
//!
//! The replicas run interleaved in simulated time (the one whose next iteration starts first goes
//! next), single-process and deterministic for a seed; the wall time grows linearly with them.
//!
//! The report is the cluster's: counters summed, TTFT and TPOT quantiles over every request, the time
//! from the first arrival to the last replica's end, the store's hits and transfer volume; and one row
//! per replica.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use kvsched_core::connector::{KvConnector, LoadEnd};
use kvsched_core::kv::chain;
use kvsched_core::kv::KvRef;

use super::block_hashes::page_hashes;
use super::disagg::{DisaggFigures, Role};
use super::faults::{Draw, Outcome};
use super::kv_router::{Ask, KvRouter};
use super::report::{Quantiles, RemoteFigures, ReplicaRow};
use super::{run_loop, OptionsError, Replica, Report, SimError, SimOptions};
use kvsched_workload::{Arrival, Workload};

/// `--remote-store PAGES[:LATENCY_US[:GBPS]]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RemoteStoreOptions {
    /// Capacity in KV pages (blocks).
    pub pages: u32,
    /// Latency of one step's reads, µs.
    pub latency_us: f64,
    /// Bandwidth of the reads, GB/s.
    pub gbps: f64,
}

/// A remote store specification [`RemoteStoreOptions::from_str`](std::str::FromStr::from_str) refused
/// (quoted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected PAGES[:LATENCY_US[:GBPS]], got {0:?}")]
pub struct BadRemoteStore(pub String);

impl std::str::FromStr for RemoteStoreOptions {
    type Err = BadRemoteStore;

    /// Parses `PAGES[:LATENCY_US[:GBPS]]`: PAGES ≥ 1, the others positive (defaults 50 µs, 25 GB/s).
    fn from_str(v: &str) -> Result<Self, BadRemoteStore> {
        let mut it = v.split(':');
        let bad = || BadRemoteStore(v.to_owned());
        let pages = it
            .next()
            .and_then(|p| p.parse::<u32>().ok())
            .filter(|&p| p > 0)
            .ok_or_else(bad)?;
        // A remote read over RDMA (NIXL, Mooncake's transfer engine): tens of µs, 25 GB/s.
        let latency_us = positive_or(it.next(), 50.0).ok_or_else(bad)?;
        let gbps = positive_or(it.next(), 25.0).ok_or_else(bad)?;
        if it.next().is_some() {
            return Err(bad());
        }
        Ok(Self {
            pages,
            latency_us,
            gbps,
        })
    }
}

/// An optional positive number of a colon-separated option (`None` for a bad one): `default` when absent.
pub(super) fn positive_or(field: Option<&str>, default: f64) -> Option<f64> {
    match field {
        None => Some(default),
        Some(x) => x.parse::<f64>().ok().filter(|x| x.is_finite() && *x > 0.0),
    }
}

/// The store the replicas share: blocks by chained key, each with the simulated time it was saved and
/// its last use, least recently used evicted beyond the capacity.
#[derive(Debug, Default)]
pub struct RemoteStore {
    capacity: usize,
    /// Saved blocks: the time they were saved and their last use.
    blocks: HashMap<u64, (f64, u64)>,
    /// The blocks by last use (the least recently used first).
    by_use: BTreeMap<u64, u64>,
    tick: u64,
    /// The keys of each request's blocks past its engine's own match, by (replica, request id): its
    /// first block's index and the keys, for the saves.
    keys: HashMap<(u32, u64), (u32, Vec<u64>)>,
    /// Blocks loaded (hits), blocks saved, blocks evicted.
    hits: u64,
    saved: u64,
    evicted: u64,
}

impl RemoteStore {
    fn new(capacity: u32) -> Self {
        Self {
            capacity: capacity as usize,
            ..Self::default()
        }
    }

    /// Marks a block used now (inserting it, saved at `at`, when absent). Returns whether it was new.
    fn touch(&mut self, k: u64, at: Option<f64>) -> bool {
        self.tick += 1;
        let tick = self.tick;
        if let Some((saved, used)) = self.blocks.get_mut(&k) {
            self.by_use.remove(used);
            *used = tick;
            if let Some(at) = at {
                *saved = saved.min(at);
            }
            self.by_use.insert(tick, k);
            false
        } else {
            let Some(at) = at else { return false };
            self.blocks.insert(k, (at, tick));
            self.by_use.insert(tick, k);
            true
        }
    }

    /// The leading blocks of `hashes` (after `chain`) saved by `now`; remembers every key for saves.
    fn lookup(
        &mut self,
        who: (u32, u64),
        first: u32,
        mut key: u64,
        hashes: &[u64],
        now: f64,
    ) -> u32 {
        let keys: Vec<u64> = hashes
            .iter()
            .map(|&h| {
                key = chain(key, h);
                key
            })
            .collect();
        let mut n = 0;
        for &k in &keys {
            if !self.blocks.get(&k).is_some_and(|&(at, _)| at <= now) {
                break;
            }
            self.touch(k, None);
            n += 1;
        }
        self.keys.insert(who, (first, keys));
        n
    }

    /// The request's prompt blocks `from..from + count` are saved (those the store lacks are added).
    fn save(&mut self, who: (u32, u64), from: u32, count: usize, now: f64) {
        let Some((first, keys)) = self.keys.get(&who) else {
            return;
        };
        let start = (from.saturating_sub(*first) as usize).min(keys.len());
        let end = (start + count).min(keys.len());
        let fresh: Vec<u64> = keys[start..end].to_vec();
        for k in fresh {
            // Already stored: it keeps the earlier save time.
            if self.touch(k, Some(now)) {
                self.saved += 1;
            }
        }
        while self.blocks.len() > self.capacity {
            let Some((_, oldest)) = self.by_use.pop_first() else {
                break;
            };
            self.blocks.remove(&oldest);
            self.evicted += 1;
        }
    }
}

/// The seeds of the store's fault draws (xored with `--seed` and the replica).
const LOAD_SEED: u64 = 0x10ad_fa11;
const SAVE_SEED: u64 = 0x5a7e_fa11;

/// One replica's connector to the shared store.
struct RemoteConnector {
    store: Rc<RefCell<RemoteStore>>,
    replica: u32,
    /// The replica's clock when its pass runs.
    now: Rc<Cell<f64>>,
    ends: Vec<KvRef>,
    save_ends: Vec<KvRef>,
    /// `--store-faults`: how each load and each save goes (`faults.rs`).
    loads: Draw,
    saves: Draw,
    /// Loads that stalled: never confirmed, until the pool abandons them.
    stalled: Vec<KvRef>,
}

impl KvConnector for RemoteConnector {
    fn matched_blocks(&mut self, r: KvRef, first_block: u32, chain: u64, hashes: &[u64]) -> u32 {
        let who = (self.replica, r.id.0);
        self.store
            .borrow_mut()
            .lookup(who, first_block, chain, hashes, self.now.get())
    }
    fn start_load(&mut self, r: KvRef, pages: &[u32], _first_block: u32) {
        self.store.borrow_mut().hits += pages.len() as u64;
        // The read runs with the step; it is confirmed before the next pass.
        self.ends.push(r);
    }
    fn cancel_load(&mut self, r: KvRef) {
        self.ends.retain(|x| *x != r);
        self.stalled.retain(|x| *x != r);
    }
    fn take_load_ends(&mut self, ended: &mut dyn FnMut(KvRef, LoadEnd)) {
        for r in self.ends.drain(..) {
            match self.loads.next() {
                Outcome::Done => ended(r, LoadEnd::Done),
                Outcome::Failed => ended(r, LoadEnd::Failed),
                Outcome::Stalled => self.stalled.push(r),
            }
        }
    }
    fn start_save(&mut self, r: KvRef, pages: &[u32], first_block: u32) -> bool {
        let who = (self.replica, r.id.0);
        let now = self.now.get();
        self.store
            .borrow_mut()
            .save(who, first_block, pages.len(), now);
        // The write runs with the next step; it is acknowledged before the next pass.
        self.save_ends.push(r);
        true
    }
    fn take_save_ends(&mut self, ended: &mut dyn FnMut(KvRef)) {
        // A save never acknowledged stays pinned until the pool's timeout cancels it.
        let acknowledged = self
            .save_ends
            .drain(..)
            .filter(|_| self.saves.next() == Outcome::Done);
        for r in acknowledged {
            ended(r);
        }
    }
    fn cancel_save(&mut self, r: KvRef) {
        self.save_ends.retain(|x| *x != r);
    }
}

/// How the router spreads requests over the replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Route {
    /// In turn.
    #[default]
    RoundRobin,
    /// To the replica with the fewest requests outstanding when it arrives.
    LeastLoaded,
    /// By the request's first prefix block (requests without one: in turn).
    PrefixAffinity,
    /// By the cost a KV-aware router fed by the replicas' KV events gives it (Dynamo's,
    /// `kv_router.rs`).
    Kv,
}

impl Route {
    /// Every route, in the order the command line lists them.
    pub const ALL: [Self; 4] = [
        Self::RoundRobin,
        Self::LeastLoaded,
        Self::PrefixAffinity,
        Self::Kv,
    ];

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::RoundRobin => "round_robin",
            Self::LeastLoaded => "least_loaded",
            Self::PrefixAffinity => "prefix_affinity",
            Self::Kv => "kv",
        }
    }
}

/// The router: the replica each arrival goes to.
struct Router {
    route: Route,
    replicas: u32,
    turn: u32,
    /// How many requests carry each prefix block (a shared system prompt: nearly all of them).
    sharing: HashMap<u64, usize>,
    /// A conversation's key is its first block shared by no more than this many requests.
    share: usize,
    /// `kv`: the KV-aware router, and the page hashes of the arrival it asks about.
    kv: Option<KvRouter>,
    hashes: Vec<u64>,
}

impl Router {
    fn new(o: &SimOptions, w: &Workload, replicas: u32) -> Self {
        let route = o.route;
        let mut sharing: HashMap<u64, usize> = HashMap::new();
        if route == Route::PrefixAffinity {
            for a in &w.arrivals {
                for &b in &a.prefix_blocks {
                    *sharing.entry(b).or_default() += 1;
                }
            }
        }
        Self {
            route,
            replicas: replicas.max(1),
            turn: 0,
            sharing,
            share: (w.arrivals.len() / replicas.max(1) as usize).max(1),
            kv: (route == Route::Kv)
                .then(|| KvRouter::new(replicas as usize, o.tokens_per_block, o.kv_overlap_weight)),
            hashes: Vec::new(),
        }
    }

    fn in_turn(&mut self) -> usize {
        self.turn = self.turn.wrapping_add(1);
        (self.turn.wrapping_sub(1) % self.replicas) as usize
    }

    /// The replica for arrival `i` (`a`), given each replica's outstanding requests.
    fn pick(
        &mut self,
        (o, w): (&SimOptions, &Workload),
        (i, a): (usize, &Arrival),
        outstanding: impl Iterator<Item = usize>,
    ) -> usize {
        match self.route {
            Route::RoundRobin => self.in_turn(),
            Route::LeastLoaded => outstanding
                .enumerate()
                .min_by_key(|&(k, n)| (n, k))
                .map_or(0, |(k, _)| k),
            Route::PrefixAffinity => {
                let key = a
                    .prefix_blocks
                    .iter()
                    .find(|b| self.sharing.get(b).is_some_and(|&c| c <= self.share))
                    .or(a.prefix_blocks.last());
                match key {
                    // A well-mixed hash of the block id, so neighbouring ids spread.
                    Some(&b) => (chain(0, b) % u64::from(self.replicas)) as usize,
                    None => self.in_turn(),
                }
            }
            Route::Kv => {
                if o.prefix_reuse {
                    let tokens = w.prefix_block_tokens.unwrap_or(0);
                    let tpb = o.tokens_per_block;
                    page_hashes(
                        &a.prefix_blocks,
                        tokens,
                        tpb,
                        a.prompt_tokens,
                        &mut self.hashes,
                    );
                }
                let ask = Ask {
                    arrival: i,
                    adapter: a.adapter,
                    prompt: a.prompt_tokens,
                    hashes: &self.hashes,
                };
                let load: Vec<usize> = outstanding.collect();
                self.kv.as_mut().map_or(0, |r| r.pick(&ask, &load))
            }
        }
    }
}

/// Runs `w` (adapters and sessions assigned) on `o.replicas` engines behind `o.route` — or, with
/// `o.disagg`, on its prefill engines behind the route and its decode engines behind them.
pub fn run(o: &SimOptions, w: &Workload) -> Result<Report, SimError> {
    let roles: Vec<Role> = match o.disagg {
        Some(d) => std::iter::repeat_n(Role::Prefill, d.prefill as usize)
            .chain(std::iter::repeat_n(Role::Decode, d.decode as usize))
            .collect(),
        None => vec![Role::Mixed; o.replicas.max(1) as usize],
    };
    let replicas = roles.len() as u32;
    let store = o
        .remote_store
        .map(|s| Rc::new(RefCell::new(RemoteStore::new(s.pages))));
    let clocks: Vec<Rc<Cell<f64>>> = (0..replicas).map(|_| Rc::default()).collect();
    let sf = o.store_faults.unwrap_or_default();
    let mut conns: Vec<RemoteConnector> = (0..replicas)
        .map(|k| RemoteConnector {
            store: store.clone().unwrap_or_default(),
            replica: k,
            now: clocks[k as usize].clone(),
            ends: Vec::new(),
            save_ends: Vec::new(),
            loads: Draw::new(
                sf.load_fail,
                sf.load_stall,
                o.seed ^ LOAD_SEED ^ u64::from(k),
            ),
            saves: Draw::new(0.0, sf.save_lost, o.seed ^ SAVE_SEED ^ u64::from(k)),
            stalled: Vec::new(),
        })
        .collect();
    // Behind the KV-aware router, the engines it routes to (not decode engines) log and tell.
    let tells = |role: Role| o.route == Route::Kv && role != Role::Decode;
    let mut engines = roles
        .iter()
        .map(|&role| Replica::new(o, w).map(|e| e.logging_kv_events(tells(role))))
        .collect::<Result<Vec<_>, _>>()?;
    let mut sims = Vec::with_capacity(replicas as usize);
    for ((e, c), &role) in engines.iter_mut().zip(conns.iter_mut()).zip(&roles) {
        let connector = store.is_some().then_some(c as &mut dyn KvConnector);
        let sim = e.sim(o, w, connector, role)?.routed();
        sims.push(if tells(role) { sim.telling() } else { sim });
    }
    // The router's engines: the prefill ones first, or all.
    let routed = o.disagg.map_or(roles.len(), |d| d.prefill as usize);
    interleave(o, w, &mut sims, &clocks, routed)?;
    let reports: Vec<Report> = sims.into_iter().map(super::run_loop::Sim::report).collect();
    let mut c = merge(o, w, &reports);
    if let Some(d) = o.disagg {
        c.disagg = Some(DisaggFigures {
            prefill_engines: d.prefill,
            decode_engines: d.decode,
            transfers: c.raw.handoff_ms.len() as u64,
            transfer_gb: c.raw.transfer_tokens as f64 * super::cost::LLAMA3_8B_KV_BYTES_PER_TOKEN
                / 1e9,
            handoff_ms: Quantiles::of(&c.raw.handoff_ms),
        });
    }
    if let Some(store) = &store {
        c.remote = Some(remote_figures(&store.borrow(), &c, o.tokens_per_block));
    }
    Ok(c)
}

/// Runs the engines interleaved in simulated time (the one whose next iteration starts first goes next),
/// routing each arrival to one of the first `routed` engines when its time comes; with disaggregation,
/// hands the computed prompts to the decode engines and tells the prefill engines when their sends end.
fn interleave(
    o: &SimOptions,
    w: &Workload,
    sims: &mut [run_loop::Sim<'_, '_>],
    clocks: &[Rc<Cell<f64>>],
    routed: usize,
) -> Result<(), SimError> {
    let mut router = Router::new(o, w, routed as u32);
    // Disaggregated: the prefill engine each arrival went to (its send's end is told there).
    let mut prefill_of = vec![0usize; w.arrivals.len()];
    let mut arrived = 0;
    loop {
        // The replica whose next iteration starts first.
        let first = sims
            .iter()
            .enumerate()
            .filter_map(|(k, s)| s.next_time().map(|t| (k, t)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        // An arrival due before it is routed first (the router sees the replicas as they are then).
        if let Some(a) = w.arrivals.get(arrived) {
            if first.is_none_or(|(_, t)| a.at_ms <= t) {
                let k = router.pick(
                    (o, w),
                    (arrived, a),
                    sims[..routed].iter().map(super::run_loop::Sim::outstanding),
                );
                sims[k].route(arrived);
                prefill_of[arrived] = k;
                arrived += 1;
                continue;
            }
        }
        let Some((k, t)) = first else { break };
        clocks[k].set(t);
        sims[k].step().map_err(|e| SimError::Replica {
            replica: k,
            source: Box::new(e),
        })?;
        if let Some(kv) = router.kv.as_mut().filter(|_| k < routed) {
            let (news, events) = sims[k].take_news();
            kv.heard(k, events, news);
            if o.check {
                sims[k].check_known(kv.known(k));
            }
        }
        // Disaggregated: computed prompts go to the least loaded decode engine; the transfers the
        // decode engines started tell their prefill engines when the sends end.
        for h in sims[k].take_handoffs() {
            let d = (routed..sims.len())
                .min_by_key(|&d| (sims[d].outstanding(), d))
                .ok_or(OptionsError::NoDecodeEngine)?;
            sims[d].hand(h);
        }
        for t in sims[k].take_started() {
            sims[prefill_of[t.arrival]].send_ends_at(t);
        }
    }
    Ok(())
}

/// What the shared store did, for the cluster's report `c` (pages of `tpb` tokens).
fn remote_figures(st: &RemoteStore, c: &Report, tpb: u32) -> RemoteFigures {
    let tokens = st.hits * u64::from(tpb);
    RemoteFigures {
        blocks_loaded: st.hits,
        blocks_saved: st.saved,
        blocks_evicted: st.evicted,
        hit_rate: if c.admitted_prompt_tokens > 0 {
            tokens as f64 / c.admitted_prompt_tokens as f64
        } else {
            0.0
        },
        transfer_gb: st.hits as f64 * super::cost::LLAMA3_8B_KV_BYTES_PER_TOKEN * f64::from(tpb)
            / 1e9,
    }
}

/// Adds a replica's counters to the cluster's.
fn add_counters(c: &mut Report, r: &Report) {
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
        yielded,
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
        invariant_violations,
        exact_audits,
        incremental_passes,
        store_loads_failed,
        store_loads_timed_out,
        store_saves_timed_out,
        transfers_failed,
        transfers_timed_out
    );
}

/// The cluster's report from the replicas'.
fn merge(o: &SimOptions, w: &Workload, reports: &[Report]) -> Report {
    let mut c = Report {
        route: o.route.name().into(),
        ..Report::new(o, w)
    };
    let (mut ttft, mut tpot, mut sched, mut handoff) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let n = reports.len().max(1) as f64;
    for (k, r) in reports.iter().enumerate() {
        add_counters(&mut c, r);
        c.digests.extend_from_slice(&r.digests);
        // The replicas run interleaved, each timed from its start: the cluster's wall time is the
        // longest.
        c.wall_seconds = c.wall_seconds.max(r.wall_seconds);
        c.starvation = c.starvation.max(r.starvation);
        c.sim_seconds = c.sim_seconds.max(r.sim_seconds);
        c.kv_gpu_util_mean_pct += r.kv_gpu_util_mean_pct / n;
        c.adapter_util_mean_pct += r.adapter_util_mean_pct / n;
        c.kv_gpu_util_peak_pct = c.kv_gpu_util_peak_pct.max(r.kv_gpu_util_peak_pct);
        c.kv_host_util_peak_pct = c.kv_host_util_peak_pct.max(r.kv_host_util_peak_pct);
        c.kv_host_cached_peak_pct = c.kv_host_cached_peak_pct.max(r.kv_host_cached_peak_pct);
        ttft.extend_from_slice(&r.raw.ttft);
        tpot.extend_from_slice(&r.raw.tpot);
        sched.extend_from_slice(&r.raw.sched_ns);
        handoff.extend_from_slice(&r.raw.handoff_ms);
        c.raw.transfer_tokens += r.raw.transfer_tokens;
        c.replicas.push(ReplicaRow {
            replica: k as u32,
            role: r.role.clone(),
            requests: r.requests_total,
            throughput_tok_s: r.throughput_tok_s,
            ttft_ms: r.ttft_ms,
            prefix_hit_rate: r.prefix_hit_rate,
            kv_gpu_util_peak_pct: r.kv_gpu_util_peak_pct,
        });
    }
    for v in [&mut ttft, &mut tpot, &mut sched, &mut handoff] {
        v.sort_by(f64::total_cmp);
    }
    (c.ttft_ms, c.tpot_ms) = (Quantiles::of(&ttft), Quantiles::of(&tpot));
    c.sched_ns_per_iter = Quantiles::of(&sched);
    let start = w.arrivals.first().map_or(0.0, |a| a.at_ms);
    c.arrival_span_seconds = w
        .arrivals
        .last()
        .map_or(0.0, |a| (a.at_ms - start).max(0.0) / 1000.0);
    c.raw.ttft = ttft;
    c.raw.tpot = tpot;
    c.raw.handoff_ms = handoff;
    c.derive();
    c
}
