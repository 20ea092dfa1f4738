//! The simulation loop, one part per concern: arrivals enter the engine's queue and the scheduler,
//! the scheduler runs a pass, the pass's work is priced by the cost model and the clock advances, the
//! step completes (tokens, replays, finished requests), and the iteration is sampled.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use kvsched_core::config::PRIORITY_CLASSES;
use kvsched_core::ids::TaskId;
use kvsched_core::kv::Tier;
use kvsched_core::page_pool::KvPoolConfig;
use kvsched_core::request::{Ownership, RequestSpec};
use kvsched_core::scheduler::TransferEnd;
use kvsched_core::Phase;

use super::backend::{SimKv, Target};
use super::check::Checker;
use super::disagg::{Handoff, Role, TransferEndAt};
use super::fairness::{Fairness, OUTPUT_WEIGHT};
use super::faults::{Draw, Outcome};
use super::kv_router::News;
use super::report::Quantiles;
use super::starvation::Waits;
use super::{
    block_hashes, Live, Out, Report, Samples, Sched, SimError, SimOptions, StepWork, MAX_LIVE,
};
use kvsched_workload::{Rng, Workload};
use rand::{Rng as _, SeedableRng};

mod forks;

/// One simulation's state between iterations, on KV backend `K`.
pub(super) struct Sim<'s, 'w, K: SimKv<'s> = Target<'s>> {
    o: &'s SimOptions,
    w: &'w Workload,
    sched: Box<Sched<'s, K>>,
    out: Box<Out>,
    kv_cfg: KvPoolConfig,
    drafts: u32,
    accept_rng: Rng,
    hashes: Vec<u64>,
    /// The arrivals this engine serves, in order (all of them; in a cluster, those routed to it).
    inbox: Vec<usize>,
    /// Arrived, not yet submitted (the scheduler's table is full).
    queue: VecDeque<usize>,
    /// The requests in the scheduler, by table slot.
    live: Vec<Option<Live>>,
    /// The next arrival, in the inbox.
    next: usize,
    now_ms: f64,
    start_ms: f64,
    r: Report,
    samples: Samples,
    sched_ns: Vec<f64>,
    ttft: Vec<f64>,
    tpot: Vec<f64>,
    wall: Instant,
    /// Drawn on a terminal once the run has taken two seconds of wall time.
    progress: Option<indicatif::ProgressBar>,
    kv_gpu_sum: f64,
    adapter_sum: f64,
    sample_every: u64,
    /// Slots of the requests the step finished (reused every iteration).
    finished: Vec<u16>,
    /// Per-adapter TTFT and service while backlogged.
    fair: Fairness,
    classes: crate::classes::Classes,
    /// Blocks the KV connector had loaded by the last pass, and those this step loads (a remote
    /// store's reads, priced on the clock).
    loaded_blocks: u64,
    step_remote_blocks: u64,
    /// Disaggregation (`disagg.rs`): this engine's part, and where its transfers stand.
    disagg: Transfers,
    /// When this iteration's pass ran, ms.
    pass_ms: f64,
    /// Behind a KV-aware router (`kv_router.rs`): what it tells the router.
    news: Option<News>,
    /// `--check` (`check.rs`).
    checker: Option<Checker>,
    /// A digest of every pass (`check::pass_digest`), for the differential check: under `--check`,
    /// and in its twin whose passes are all full ones.
    digests: Option<Vec<u64>>,
    /// The starvation figure's waits (`starvation.rs`).
    waits: Waits,
    /// Requests whose prompt is computed and whose other samples wait to be forked (`forks.rs`):
    /// their handle and the next sample's index.
    forks_due: Vec<(kvsched_core::scheduler::Handle, u32)>,
}

/// A disaggregated engine's transfers.
#[derive(Debug, Default)]
struct Transfers {
    role: Role,
    /// Prefill: the prompts computed this step, for the cluster to hand to a decode engine.
    handoffs: Vec<Handoff>,
    /// Decode: handed-over requests not yet submitted, in the order they were handed over.
    incoming: VecDeque<Handoff>,
    /// Decode: each handed-over request's first token (its prompt's end on the prefill engine), ms.
    first_tokens: HashMap<usize, f64>,
    /// Decode: the transfers started this step, for the cluster to tell the prefill engine.
    started: Vec<TransferEndAt>,
    /// Transfers in flight whose end is known: sends (prefill) or receives (decode).
    ends: Vec<TransferEndAt>,
    /// Live requests a transfer holds: sending (prefill), or receiving and not ended (decode).
    held: usize,
    /// Decode: how each transfer goes (`--link-faults`, `faults.rs`).
    link: Draw,
}

impl<'s, 'w, K: SimKv<'s>> Sim<'s, 'w, K> {
    pub(super) fn new(
        o: &'s SimOptions,
        w: &'w Workload,
        mut sched: Box<Sched<'s, K>>,
        out: Box<Out>,
        kv_cfg: KvPoolConfig,
    ) -> Self {
        sched.set_incremental(!o.full_passes);
        let n = w.arrivals.len();
        let now_ms = w.arrivals.first().map_or(0.0, |a| a.at_ms);
        Self {
            o,
            w,
            sched,
            out,
            kv_cfg,
            drafts: o.spec_decode.map_or(0, |s| s.drafts),
            accept_rng: Rng::seed_from_u64(o.seed ^ 0xacce_97ed),
            hashes: Vec::new(),
            inbox: (0..n).collect(),
            queue: VecDeque::new(),
            live: vec![None; MAX_LIVE],
            next: 0,
            now_ms,
            start_ms: now_ms,
            r: Report::new(o, w),
            samples: Samples::default(),
            sched_ns: Vec::new(),
            ttft: Vec::new(),
            tpot: Vec::new(),
            wall: Instant::now(),
            progress: (o.progress && std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .then(|| progress_bar(n as u64)),
            kv_gpu_sum: 0.0,
            adapter_sum: 0.0,
            sample_every: (n / 4000).max(1) as u64,
            finished: Vec::new(),
            checker: Checker::new(o),
            digests: (o.check || o.full_passes).then(Vec::new),
            waits: Waits::default(),
            forks_due: Vec::new(),
            fair: Fairness::new(o.adapters.count),
            classes: crate::classes::Classes::default(),
            loaded_blocks: 0,
            step_remote_blocks: 0,
            disagg: Transfers {
                link: o.link_faults.map_or_else(Draw::default, |f| {
                    Draw::new(f.fail, f.stall, o.seed ^ 0x114c_fa11)
                }),
                ..Transfers::default()
            },
            pass_ms: now_ms,
            news: None,
        }
    }

    /// The engine as a prefill or decode engine of a disaggregated cluster.
    pub(super) fn with_role(mut self, role: Role) -> Self {
        self.disagg.role = role;
        self
    }

    /// Prefill: the requests whose prompt the last step computed, to hand to a decode engine.
    pub(super) fn take_handoffs(&mut self) -> Vec<Handoff> {
        std::mem::take(&mut self.disagg.handoffs)
    }

    /// Decode: a request whose prompt a prefill engine computed arrives.
    pub(super) fn hand(&mut self, h: Handoff) {
        self.disagg.incoming.push_back(h);
    }

    /// Decode: the transfers the last step started (when each ends), to tell the prefill engines.
    pub(super) fn take_started(&mut self) -> Vec<TransferEndAt> {
        std::mem::take(&mut self.disagg.started)
    }

    /// Prefill: the send of a request's KV ends at `t.at_ms` (its decode engine's receive started).
    pub(super) fn send_ends_at(&mut self, t: TransferEndAt) {
        self.disagg.ends.push(t);
    }

    /// The engine as a cluster's replica: it serves only what the router sends it ([`Sim::route`]),
    /// from the first arrival on; no progress bar of its own.
    pub(super) fn routed(mut self) -> Self {
        self.inbox.clear();
        self.progress = None;
        self
    }

    /// The engine behind a KV-aware router: it keeps the news the router asks for ([`Sim::take_news`]).
    pub(super) fn telling(mut self) -> Self {
        self.news = Some(News::default());
        self
    }

    /// What it told the router since the last call, and the KV events its pool logged (empty unless
    /// [`Sim::telling`] and the pool logs them).
    pub(super) fn take_news(&mut self) -> (News, &[kvsched_core::kv_events::KvEvent]) {
        let news = self.news.as_mut().map(std::mem::take).unwrap_or_default();
        (news, self.sched.take_kv_events())
    }

    /// `--check` behind a KV-aware router, at the exact audits (O(pages)): whether `known` (block key
    /// → a bit per tier, GPU 1 and host 2) is what its prefix cache holds — or, after its event log
    /// overflowed, a part of it. Counts a violation when not.
    pub(super) fn check_known(&mut self, known: &HashMap<u64, u8>) {
        if !self.checker.as_ref().is_some_and(Checker::audited) {
            return;
        }
        let pool = self.sched.kv().lead();
        let c = pool.config();
        let gpu = (0..c.gpu_pages).map(|p| (p, 1u8));
        let host = (0..c.host_pages).map(|h| (h | kvsched_core::page_pool::HOST, 2u8));
        let mut held: HashMap<u64, u8> = HashMap::new();
        for (entry, bit) in gpu.chain(host) {
            if let Some(info) = pool
                .page_info(entry)
                .filter(kvsched_core::page_pool::PageInfo::cached)
            {
                *held.entry(info.key()).or_default() |= bit;
            }
        }
        let overflowed = pool.kv_event_log().is_some_and(|(_, lost)| lost > 0);
        let part = known
            .iter()
            .all(|(k, t)| held.get(k).is_some_and(|h| h & t == *t));
        if !part || (!overflowed && known.len() != held.len()) {
            self.r.invariant_violations += 1;
        }
    }

    /// The router sends it arrival `i` (arrivals come in time order).
    pub(super) fn route(&mut self, i: usize) {
        self.inbox.push(i);
    }

    /// Requests it holds or has been sent and not finished (the least-loaded route's measure).
    pub(super) fn outstanding(&self) -> usize {
        self.sched.len()
            + self.queue.len()
            + (self.inbox.len() - self.next)
            + self.disagg.incoming.len()
    }

    /// There is something to schedule: a live request no transfer holds, or a queued one.
    fn has_work(&self) -> bool {
        self.sched.len() > self.disagg.held || !self.queue.is_empty()
    }

    /// The next thing that will happen without a pass: an arrival, a handed-over request, a
    /// transfer's end.
    fn next_event_ms(&self) -> Option<f64> {
        let ends = self.disagg.ends.iter().map(|t| t.at_ms);
        let incoming = self.disagg.incoming.front().map(|h| h.at_ms);
        let arrival = self.upcoming().map(|a| a.at_ms);
        ends.chain(incoming).chain(arrival).min_by(f64::total_cmp)
    }

    /// The next arrival in the inbox.
    fn upcoming(&self) -> Option<&kvsched_workload::Arrival> {
        self.inbox.get(self.next).map(|&i| &self.w.arrivals[i])
    }

    /// One iteration: arrivals, the pass, its cost on the clock, the step completed, the sample. False
    /// when every request is done.
    pub(super) fn step(&mut self) -> Result<bool, SimError> {
        if !self.admit_arrivals()? {
            return Ok(false);
        }
        let (page_moves, adapter_pages) = self.pass()?;
        let work = self.step_work(page_moves, adapter_pages)?;
        self.advance_clock(&work);
        self.complete()?;
        self.sample();
        Ok(true)
    }

    /// When the next iteration starts (`None`: nothing to do, every request done or waiting for
    /// another engine): now with work in hand, else at the next event.
    pub(super) fn next_time(&self) -> Option<f64> {
        if self.has_work() {
            return Some(self.now_ms);
        }
        self.next_event_ms().map(|t| t.max(self.now_ms))
    }

    /// Ends the transfers due, moves the requests that have arrived (or were handed over) into the
    /// queue and as many as fit into the scheduler; with nothing to schedule, jumps to the next event.
    /// False when there is nothing to do.
    pub(super) fn admit_arrivals(&mut self) -> Result<bool, SimError> {
        loop {
            self.end_transfers()?;
            while let Some(a) = self.upcoming().filter(|a| a.at_ms <= self.now_ms) {
                self.fair.arrived(a.adapter);
                self.queue.push_back(self.inbox[self.next]);
                self.next += 1;
            }
            let d = &mut self.disagg;
            while let Some(h) = d.incoming.front().filter(|h| h.at_ms <= self.now_ms) {
                d.first_tokens.insert(h.arrival, h.at_ms);
                self.queue.push_back(h.arrival);
                d.incoming.pop_front();
            }
            while self.sched.len() < MAX_LIVE {
                let Some(&i) = self.queue.front() else { break };
                self.submit(i)?;
                self.queue.pop_front();
            }
            if self.has_work() {
                return Ok(true);
            }
            let Some(at) = self.next_event_ms() else {
                return Ok(false);
            };
            self.now_ms = self.now_ms.max(at);
        }
    }

    /// The transfers whose end is due: a prefill engine's send frees the request's pages
    /// (`end_send`); a decode engine's receive makes it decode (`end_receive`).
    fn end_transfers(&mut self) -> Result<(), SimError> {
        let mut k = 0;
        while k < self.disagg.ends.len() {
            if self.disagg.ends[k].at_ms > self.now_ms {
                k += 1;
                continue;
            }
            let t = self.disagg.ends.remove(k);
            // A request's id is its arrival's index.
            let h = self
                .sched
                .find(kvsched_core::RequestId(t.arrival as u64))
                .ok_or(SimError::TransferNotLive { arrival: t.arrival })?;
            let slot = h.index() as usize;
            let end = if t.delivered {
                TransferEnd::Delivered
            } else {
                TransferEnd::Failed
            };
            if self.disagg.role == Role::Prefill {
                self.sched.end_send(h, end).map_err(SimError::Scheduler)?;
                self.live[slot] = None;
                self.waits.left(h.index());
            } else {
                // A failed receive recomputes the prompt here (the core's arrow 4).
                self.sched
                    .end_receive(h, end)
                    .map_err(SimError::Scheduler)?;
                // Its wait for the scheduler begins when its prompt's KV (or its recompute) is ready.
                self.waits.entered(h.index(), t.arrival as u64, self.now_ms);
                let handed = self.disagg.first_tokens.get(&t.arrival).copied();
                if t.delivered {
                    let handoff = t.at_ms - handed.unwrap_or(t.at_ms);
                    self.r.raw.handoff_ms.push(handoff);
                }
            }
            self.disagg.held -= 1;
        }
        Ok(())
    }

    fn submit(&mut self, i: usize) -> Result<(), SimError> {
        let (o, a) = (self.o, &self.w.arrivals[i]);
        let mut spec = RequestSpec::new(i as u64, Phase::ContextInit, a.prompt_tokens);
        spec.max_new_tokens = a.output_tokens;
        // Disaggregated: a prefill engine computes the prompt only; a decode engine receives it, with
        // the first token the prefill engine produced.
        let handed = match self.disagg.role {
            Role::Mixed => None,
            Role::Prefill => {
                spec.context_only = true;
                None
            }
            Role::Decode => {
                spec.phase = Phase::DisaggGenerationInit;
                self.disagg.first_tokens.get(&i).copied()
            }
        };
        spec.lora = a.adapter.map(|x| TaskId(x as u64));
        spec.draft = self.drafts;
        // Deadline admission: an adapter's class is its id modulo the classes; arrivals in µs.
        spec.priority = match o.priority_mix {
            Some(share) => u8::from(!crate::classes::is_high(i, share)),
            None => a
                .adapter
                .map_or(0, |x| (x as usize % PRIORITY_CLASSES) as u8),
        };
        // Two classes: each request's service class is its class (high: 0, with `--class-share`).
        if o.priority_mix.is_some() {
            spec.class = spec.priority;
        }
        spec.arrival = (a.at_ms * 1000.0) as u64;
        self.hashes.clear();
        if o.prefix_reuse {
            block_hashes::page_hashes(
                &a.prefix_blocks,
                self.w.prefix_block_tokens.unwrap_or(0),
                o.tokens_per_block,
                a.prompt_tokens,
                &mut self.hashes,
            );
        }
        let h = self
            .sched
            .submit_with_prefix(spec, 0, &self.hashes)
            .map_err(SimError::Scheduler)?;
        if let Some(n) = &mut self.news {
            n.roots
                .push((a.adapter, self.sched.kv().lead().seq(h.index()).root));
        }
        self.waits.entered(h.index(), i as u64, self.now_ms);
        self.live[h.index() as usize] = Some(Live {
            arrival: i,
            handle: h,
            prompt0: a.prompt_tokens,
            output: a.output_tokens,
            generated: u32::from(handed.is_some()),
            first_token_ms: handed,
            last_token_ms: handed.unwrap_or(0.0),
            first_chunk: true,
            // Its prompt was admitted (and counted) on the prefill engine.
            replay: handed.is_some(),
            sample: 0,
        });
        Ok(())
    }

    /// Runs one scheduling pass and its adapter plan (timed), counts what it did, and drains the page
    /// moves. Returns (KV pages moved, adapter pages loaded).
    pub(super) fn pass(&mut self) -> Result<(u64, u64), SimError> {
        self.pass_ms = self.now_ms;
        let (sched, out, r) = (&mut self.sched, &mut self.out, &mut self.r);
        let t0 = Instant::now();
        let pass = sched.schedule(out);
        let ensured = pass.is_ok().then(|| sched.ensure_batch(out));
        let ns = t0.elapsed().as_nanos() as f64;
        pass.map_err(SimError::Scheduler)?;
        if let Some(Err(e)) = ensured {
            r.invariant_violations += 1;
            return Err(SimError::EnsureBatch(e));
        }
        self.sched_ns.push(ns);
        r.iterations += 1;
        let ran = out.context().iter().map(|c| c.listed.slot());
        let ran = ran.chain(
            out.generation()
                .iter()
                .chain(out.disagg())
                .map(|l| l.slot()),
        );
        self.waits.scheduled(ran, self.pass_ms);
        let stats = sched.last_pass();
        r.suspended += stats.victims as u64 + stats.self_evictions as u64;
        r.self_evicted += stats.self_evictions as u64;
        r.recompute_paused += out.recompute_paused().len() as u64;
        r.preempted += stats.preemptions as u64;
        r.yielded += u64::from(stats.yielded);
        r.resumed += out.resumed().len() as u64;
        let mut page_moves = 0u64;
        for m in sched.take_moves() {
            page_moves += 1;
            match m.from {
                Tier::Gpu => r.pages_offloaded += 1,
                Tier::Host => r.pages_reloaded += 1,
            }
        }
        page_moves += K::other_moves(sched, self.o);
        let mut load_pages = 0u64;
        for t in out.adapter_loads() {
            load_pages += sched.adapters().backend().tasks()[t.slot.index()].pages as u64;
        }
        r.adapter_loads += out.adapter_loads().len() as u64;
        let loaded = sched
            .kv()
            .lead()
            .connector_stats()
            .map_or(0, |c| c.loaded_blocks);
        self.step_remote_blocks = loaded - self.loaded_blocks;
        self.loaded_blocks = loaded;
        if let Some(c) = &mut self.checker {
            // The slots the last step finished were touched too: their rows must be gone.
            r.invariant_violations += c.iteration(sched, out, self.o, &self.finished);
        }
        if let Some(d) = &mut self.digests {
            // The scheduler's state every --check-every passes, the pools' at the end (`report`).
            let state = (d.len() as u64 + 1) % self.o.check_every.max(1) == 0;
            d.push(super::check::pass_digest(sched, out, state, false));
        }
        Ok((page_moves, load_pages))
    }

    /// The step's work: each chunk after the context before it (a first chunk starts at its reused
    /// prefix), each decode request at its context length with its drafts to verify.
    pub(super) fn step_work(
        &mut self,
        page_moves: u64,
        adapter_pages: u64,
    ) -> Result<StepWork, SimError> {
        let mut work = StepWork {
            adapter_pages,
            page_moves,
            ..StepWork::default()
        };
        let r = &mut self.r;
        for c in self.out.context() {
            let Some(lv) = self.live[c.listed.slot() as usize].as_mut() else {
                continue;
            };
            let spec = self
                .sched
                .get(lv.handle)
                .map_err(SimError::Scheduler)?
                .spec();
            work.chunk(u64::from(c.tokens), u64::from(spec.position));
            let adapter = self.w.arrivals[lv.arrival].adapter;
            self.fair.served(adapter, f64::from(c.tokens));
            if std::mem::take(&mut lv.first_chunk) {
                r.prefill_tokens_saved += u64::from(spec.position);
                if !lv.replay {
                    r.admitted_prompt_tokens += u64::from(spec.prompt);
                    r.admitted_reused_tokens += u64::from(spec.position);
                }
            }
        }
        for g in self.out.generation() {
            let Some(lv) = self.live[g.slot() as usize].as_ref() else {
                continue;
            };
            work.decode(
                u64::from(lv.prompt0) + u64::from(lv.generated),
                u64::from(self.drafts),
            );
        }
        Ok(work)
    }

    /// Advances the clock by the step's cost; an idle step waits for the next arrival.
    pub(super) fn advance_clock(&mut self, work: &StepWork) {
        let busy = work.prefill_tokens > 0 || work.decode_requests > 0;
        // A remote store's reads run with the step (layer by layer): the step waits for them.
        let remote_us = match (self.o.remote_store, self.step_remote_blocks) {
            (Some(s), blocks) if blocks > 0 => {
                let bytes = super::cost::LLAMA3_8B_KV_BYTES_PER_TOKEN
                    * f64::from(self.o.tokens_per_block)
                    * blocks as f64;
                s.latency_us + bytes / (s.gbps * 1000.0)
            }
            _ => 0.0,
        };
        let step_us = remote_us
            + if busy {
                self.o.cost.step_us(work)
            } else {
                let idle = self.o.cost.step_us(&StepWork {
                    page_moves: work.page_moves,
                    ..StepWork::default()
                });
                match self.upcoming() {
                    Some(a) => (a.at_ms - self.now_ms).max(0.0) * 1000.0 + idle,
                    None => idle,
                }
            };
        self.now_ms += step_us / 1000.0;
        self.fair.elapsed(step_us / 1000.0);
        self.r.prefill_tokens += work.prefill_tokens;
    }

    /// Completes the step as the engine would: prefill chunks advance (the last yields the first
    /// token), decode steps keep one token plus their accepted drafts, recompute-paused requests are
    /// reset to replay, and finished requests leave.
    pub(super) fn complete(&mut self) -> Result<(), SimError> {
        self.sched
            .complete_step(&self.out)
            .map_err(SimError::Scheduler)?;
        self.finished.clear();
        self.complete_chunks()?;
        self.start_receives()?;
        self.complete_decodes()?;
        self.reset_replays()?;
        self.fork_samples()?;
        self.remove_finished()
    }

    fn complete_chunks(&mut self) -> Result<(), SimError> {
        for c in self.out.context() {
            let slot = c.listed.slot();
            let Some(lv) = self.live[slot as usize].as_mut() else {
                continue;
            };
            let e = self.sched.get(lv.handle).map_err(SimError::Scheduler)?;
            // A context-only request's prompt is computed: its first token, then its send.
            let sending = e.spec().phase == Phase::DisaggContextTransInProgress;
            if e.spec().phase != Phase::GenerationInProgress && !sending {
                continue;
            }
            // The last prefill chunk yields the first token.
            lv.generated += 1;
            self.r.tokens_generated += 1;
            let a = &self.w.arrivals[lv.arrival];
            self.fair.served(a.adapter, OUTPUT_WEIGHT);
            if let Some(n) = &mut self.news {
                n.prefilled.push(lv.arrival);
                if sending {
                    n.finished.push(lv.arrival);
                }
            }
            if lv.sample == 0 && lv.first_token_ms.is_none() && self.o.samples > 1 {
                self.forks_due.push((lv.handle, 1));
            }
            if lv.first_token_ms.is_none() {
                lv.first_token_ms = Some(self.now_ms);
                self.ttft.push(self.now_ms - a.at_ms);
                self.fair.first_token(a.adapter, self.now_ms - a.at_ms);
                if let Some(share) = self.o.priority_mix {
                    let class = usize::from(!crate::classes::is_high(lv.arrival, share));
                    self.classes.first_token(class, self.now_ms - a.at_ms);
                }
            }
            lv.last_token_ms = self.now_ms;
            if lv.generated >= lv.output {
                self.finished.push(slot);
            } else if sending {
                self.disagg.handoffs.push(Handoff {
                    arrival: lv.arrival,
                    at_ms: self.now_ms,
                });
                self.disagg.held += 1;
            } else if self.drafts > 0 {
                // The last chunk reserved its drafts' slots; it yields one token.
                self.sched
                    .rewind(lv.handle, self.drafts)
                    .map_err(SimError::Scheduler)?;
            }
        }
        Ok(())
    }

    /// Decode: the requests whose pages the pass prepared start receiving their prompt's KV (from
    /// the pass on: latency plus bytes over the link).
    fn start_receives(&mut self) -> Result<(), SimError> {
        let Some(link) = self.o.disagg else {
            return Ok(());
        };
        for l in self.out.disagg() {
            let Some(lv) = self.live[l.slot() as usize].as_ref() else {
                continue;
            };
            self.sched
                .start_receive(lv.handle)
                .map_err(SimError::Scheduler)?;
            let at_ms = self.pass_ms + link.transfer_ms(lv.prompt0);
            let (at_ms, delivered) = match self.disagg.link.next() {
                Outcome::Done => (at_ms, true),
                Outcome::Failed => {
                    self.r.transfers_failed += 1;
                    (at_ms, false)
                }
                Outcome::Stalled => {
                    self.r.transfers_timed_out += 1;
                    (
                        self.pass_ms + self.o.link_faults.map_or(0.0, |f| f.timeout_ms),
                        false,
                    )
                }
            };
            let t = TransferEndAt {
                arrival: lv.arrival,
                at_ms,
                delivered,
            };
            self.disagg.ends.push(t);
            self.disagg.started.push(t);
            self.disagg.held += 1;
            self.r.raw.transfer_tokens += u64::from(lv.prompt0);
        }
        Ok(())
    }

    fn complete_decodes(&mut self) -> Result<(), SimError> {
        for l in self.out.generation() {
            let Some(lv) = self.live[l.slot() as usize].as_mut() else {
                continue;
            };
            // A step keeps one token plus the accepted run of its drafts; the rejected drafts' KV
            // slots are given back.
            let rng = &mut self.accept_rng;
            let accepted = self.o.spec_decode.map_or(0, |s| {
                (0..s.drafts)
                    .take_while(|_| rng.gen::<f64>() < s.accept)
                    .count() as u32
            });
            let kept = (1 + accepted).min(lv.output - lv.generated);
            lv.generated += kept;
            let adapter = self.w.arrivals[lv.arrival].adapter;
            self.fair.served(adapter, OUTPUT_WEIGHT * f64::from(kept));
            self.r.tokens_generated += u64::from(kept);
            self.r.decode_steps += 1;
            self.r.accepted_drafts += u64::from(kept - 1);
            lv.last_token_ms = self.now_ms;
            if lv.generated >= lv.output {
                self.finished.push(l.slot());
            } else if self.drafts > 0 {
                self.sched
                    .rewind(lv.handle, self.drafts - accepted)
                    .map_err(SimError::Scheduler)?;
            }
        }
        Ok(())
    }

    fn reset_replays(&mut self) -> Result<(), SimError> {
        for l in self.out.recompute_paused() {
            // The replay re-prefills the prompt plus what was generated (beam 1), as upstream's pause.
            let Some(lv) = self.live[l.slot() as usize].as_mut() else {
                continue;
            };
            lv.first_chunk = true;
            lv.replay = true;
            let (h, prompt) = (lv.handle, lv.prompt0 + lv.generated);
            let remaining = lv.output - lv.generated;
            self.sched
                .update(h, |s| {
                    s.prompt = prompt;
                    s.max_new_tokens = remaining;
                })
                .map_err(SimError::Scheduler)?;
        }
        Ok(())
    }

    fn remove_finished(&mut self) -> Result<(), SimError> {
        let o = self.o;
        for &slot in &self.finished {
            let Some(lv) = self.live[slot as usize].take() else {
                continue;
            };
            self.waits.left(slot);
            self.sched.remove(lv.handle).map_err(SimError::Scheduler)?;
            if lv.sample > 0 {
                // A fork: its tokens are counted; the request is its arrival's, counted once.
                self.r.samples_completed += 1;
                continue;
            }
            if let Some(n) = &mut self.news {
                n.finished.push(lv.arrival);
            }
            let r = &mut self.r;
            r.requests_completed += 1;
            r.completed_output_tokens += lv.output as u64;
            let first = lv.first_token_ms.unwrap_or(lv.last_token_ms);
            let its_tpot = if lv.output > 1 {
                let t = (lv.last_token_ms - first) / (lv.output - 1) as f64;
                self.tpot.push(t);
                t
            } else {
                0.0
            };
            // Goodput (DistServe): a request counts when it met both objectives.
            let its_ttft = first - self.w.arrivals[lv.arrival].at_ms;
            let met = o.slo_ttft_ms.is_none_or(|s| its_ttft <= s)
                && o.slo_tpot_ms.is_none_or(|s| its_tpot <= s);
            r.slo_met += u64::from(met);
            if let Some(share) = o.priority_mix {
                let class = usize::from(!crate::classes::is_high(lv.arrival, share));
                let tpot = (lv.output > 1).then_some(its_tpot);
                self.classes.finished(class, tpot, met);
            }
        }
        Ok(())
    }

    /// Utilization (the pages requests hold; cached blocks nobody holds are the cache's), the plot's
    /// samples, and the progress line.
    pub(super) fn sample(&mut self) {
        let pct = |n: u32, of: u32| {
            if of > 0 {
                100.0 * n as f64 / of as f64
            } else {
                0.0
            }
        };
        let (sched, r) = (&self.sched, &mut self.r);
        let kv = sched.kv().lead();
        let (gpu, host) = (self.kv_cfg.gpu_pages, self.kv_cfg.host_pages);
        let kv_gpu = pct(gpu - kv.gpu_free() - kv.idle_pages(Tier::Gpu), gpu);
        let kv_gpu = sched.kv().fullest_gpu_pct(kv_gpu);
        let kv_host = pct(host - kv.host_free() - kv.idle_pages(Tier::Host), host);
        let adapters = sched.adapters().backend();
        self.kv_gpu_sum += kv_gpu;
        // Unified paging: the adapters' share of the one pool.
        let (device_used, device_pages) = if self.o.adapters.unified {
            (kv.adapter_usage().0, gpu)
        } else {
            (adapters.device_used(), self.o.adapters.device_pages)
        };
        self.adapter_sum += 100.0 * device_used as f64 / device_pages.max(1) as f64;
        r.kv_gpu_util_peak_pct = r.kv_gpu_util_peak_pct.max(kv_gpu);
        r.kv_host_util_peak_pct = r.kv_host_util_peak_pct.max(kv_host);
        let cached = pct(kv.idle_pages(Tier::Host), host);
        r.kv_host_cached_peak_pct = r.kv_host_cached_peak_pct.max(cached);
        if r.iterations % self.sample_every == 0 {
            let waiting = self.queue.len()
                + sched
                    .requests()
                    .filter(|(_, e)| e.ownership() == Ownership::Waiting)
                    .count();
            let s = &mut self.samples;
            s.t.push((self.now_ms - self.start_ms) / 1000.0);
            s.queue.push(waiting as f64);
            s.batch
                .push((self.out.generation().len() + self.out.context().len()) as f64);
            s.kv_gpu.push(kv_gpu);
            s.kv_host.push(kv_host);
            s.idle_gpu.push(pct(kv.idle_pages(Tier::Gpu), gpu));
            s.idle_host.push(pct(kv.idle_pages(Tier::Host), host));
            s.free_gpu.push(pct(kv.gpu_free(), gpu));
            s.free_host.push(pct(kv.host_free(), host));
            s.adapters
                .push(adapters.tasks().iter().filter(|t| t.on_device).count() as f64);
        }
        self.progress();
    }

    fn progress(&mut self) {
        let Some(bar) = &self.progress else { return };
        if bar.is_hidden() {
            if self.wall.elapsed().as_secs_f64() <= 2.0 {
                return;
            }
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr_with_hz(5));
        }
        bar.set_position(self.r.requests_completed);
        bar.set_message(format!(
            "{:.0} s simulated",
            (self.now_ms - self.start_ms) / 1000.0
        ));
    }

    /// The KV backend (its own figures, for the report).
    pub(super) fn backend(&self) -> &K {
        self.sched.kv()
    }

    /// The scheduler, writable (the check mode's tests plant faults in it).
    #[cfg(test)]
    pub(super) fn sched_mut(&mut self) -> &mut Sched<'s, K> {
        &mut self.sched
    }

    /// The run's figures so far.
    #[cfg(test)]
    pub(super) fn figures(&self) -> &Report {
        &self.r
    }

    /// The run's report.
    pub(super) fn report(mut self) -> Report {
        if let Some(c) = self.sched.kv().lead().connector_stats() {
            self.r.store_loads_failed = c.failed;
            self.r.store_loads_timed_out = c.timed_out;
            self.r.store_saves_timed_out = c.saves_timed_out;
        }
        if let Some(c) = &mut self.checker {
            self.r.invariant_violations += c.audit(&self.sched);
            self.r.exact_audits = c.audits;
        }
        self.r.incremental_passes = self.sched.replayed_passes();
        self.r.starvation = std::mem::take(&mut self.waits).finish(self.now_ms);
        if let Some(mut d) = self.digests.take() {
            // The state the run ends in, pools included.
            d.push(super::check::pass_digest(
                &self.sched,
                &self.out,
                true,
                true,
            ));
            self.r.digests = d;
        }
        if let Some(bar) = self.progress.take() {
            if !bar.is_hidden() {
                bar.finish();
                eprintln!();
            }
        }
        let (o, w) = (self.o, self.w);
        let r = &mut self.r;
        let stats = self.sched.adapters().backend().stats();
        // Unified paging: the pool evicts the adapters (for KV or for other adapters).
        r.adapter_evictions = if o.adapters.unified {
            self.sched.kv().lead().adapter_stats().1
        } else {
            stats.device_evictions
        };
        if let Some(p) = self.sched.kv().lead().prefix_stats() {
            r.cached_blocks_evicted = p.evicted;
            r.cached_blocks_demoted = p.demoted;
            r.host_cache_hits = p.host_hits;
        }
        r.requests_total = match self.disagg.role {
            Role::Decode => self.disagg.first_tokens.len(),
            _ => self.inbox.len(),
        };
        r.role = match self.disagg.role {
            Role::Mixed => String::new(),
            role => role.name().into(),
        };
        r.sim_seconds = (self.now_ms - self.start_ms) / 1000.0;
        r.arrival_span_seconds = self.inbox.last().map_or(0.0, |&i| {
            (w.arrivals[i].at_ms - self.start_ms).max(0.0) / 1000.0
        });
        r.wall_seconds = self.wall.elapsed().as_secs_f64();
        r.kv_gpu_util_mean_pct = self.kv_gpu_sum / r.iterations.max(1) as f64;
        r.adapter_util_mean_pct = self.adapter_sum / r.iterations.max(1) as f64;
        for v in [&mut self.ttft, &mut self.tpot, &mut self.sched_ns] {
            v.sort_by(f64::total_cmp);
        }
        r.ttft_ms = Quantiles::of(&self.ttft);
        r.tpot_ms = Quantiles::of(&self.tpot);
        r.sched_ns_per_iter = Quantiles::of(&self.sched_ns);
        r.raw = super::report::RawSamples {
            ttft: std::mem::take(&mut self.ttft),
            tpot: std::mem::take(&mut self.tpot),
            sched_ns: std::mem::take(&mut self.sched_ns),
            ..std::mem::take(&mut r.raw)
        };
        (r.per_adapter, r.jain_fairness) = std::mem::take(&mut self.fair).finish();
        if self.o.priority_mix.is_some() {
            r.per_class = Some(std::mem::take(&mut self.classes).finish(r.sim_seconds));
        }
        r.samples = std::mem::take(&mut self.samples);
        r.derive();
        self.r
    }
}

/// A progress bar over `n` requests, hidden until [`Sim::progress`] shows it.
fn progress_bar(n: u64) -> indicatif::ProgressBar {
    let bar =
        indicatif::ProgressBar::with_draw_target(Some(n), indicatif::ProgressDrawTarget::hidden());
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "[{bar:30}] {percent:>3}%  {pos} of {len} requests, {msg}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}
