//! The hybrid engine: kvsched-core's scheduler over a [`Hybrid`] backend (one full-attention group
//! and a recurrent-state group) driving the mechanism model, with every page move, state move,
//! restore and snapshot capture the scheduler logs carried out on real memory, and free pages and
//! state slots filled with NaN after every step (so a read of a stale or freed one shows up as a
//! wrong token).

use kvsched_core::kv_groups::{Attention, Group, Hybrid, KvGroups};
use kvsched_core::output::SchedulerOutput;
use kvsched_core::page_pool::{KvPool, KvPoolConfig};
use kvsched_core::request::RequestSpec;
use kvsched_core::scheduler::{Handle, Scheduler};
use kvsched_core::state_pool::{Capture, Placement, StateConfig};
use kvsched_core::storage::Owned;
use kvsched_core::{AdapterPool, Config as SchedulerConfig, Phase};

use super::mechanism::HybridModel;
use super::store::Stores;
use crate::error::{EngineError, Result};
use crate::math::argmax;

/// Requests the hybrid engine holds at once.
pub const HYBRID_REQUESTS: usize = 16;

type Backend = Hybrid<KvPool<'static, Owned>, 1, HYBRID_REQUESTS>;
type Sched = Scheduler<Backend, AdapterPool<1>, HYBRID_REQUESTS, 1>;

/// A hybrid engine's memory and scheduling.
#[derive(Debug, Clone, Copy)]
pub struct HybridConfig {
    /// Tokens per KV page.
    pub tokens_per_block: u32,
    /// Attention KV pages on the GPU tier and the host tier.
    pub pages: [u32; 2],
    /// The state group: slots, snapshots, interval (`slot_bytes` is the model's, set here).
    pub state: StateConfig,
    /// The scheduler's configuration.
    pub scheduler: SchedulerConfig,
    /// Fill free pages and state slots with NaN after every step.
    pub poison: bool,
}

/// What the engine did, summed over its steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HybridStats {
    /// Model steps run.
    pub steps: u64,
    /// Requests finished.
    pub requests: u64,
    /// Tokens computed (prompt and generated).
    pub tokens: u64,
    /// Suspensions (the pass's paused lists).
    pub suspensions: u64,
    /// Recompute pauses and preemptions.
    pub recomputes: u64,
    /// Prompt tokens reused from the prefix cache (and its snapshots).
    pub reused: u64,
    /// Prefix hits restored from a snapshot.
    pub snapshot_hits: u64,
    /// State moves run (host moves and restores).
    pub state_moves: u64,
    /// Snapshot captures the steps wrote.
    pub captures: u64,
    /// Context-side preemptions (the pass's).
    pub preemptions: u64,
}

/// A finished request: its generated tokens and each one's logits.
#[derive(Debug, Clone, PartialEq)]
pub struct HybridCompletion {
    /// The id it was submitted with.
    pub id: u64,
    /// Generated tokens.
    pub tokens: Vec<u32>,
    /// Each generated token's logits.
    pub logits: Vec<Vec<f32>>,
    /// Prompt tokens its first chunk reused.
    pub cached: u32,
}

/// A request the engine holds.
#[derive(Debug)]
struct Live {
    id: u64,
    handle: Handle,
    /// Prompt then generated tokens.
    tokens: Vec<u32>,
    /// Tokens whose keys, values and state the caches hold.
    computed: usize,
    max_new: usize,
    generated: Vec<u32>,
    logits: Vec<Vec<f32>>,
    cached: u32,
}

/// The hybrid engine: kvsched-core's scheduler over a hybrid backend driving the mechanism model,
/// every move carried out on real memory, NaN in free pages and state slots after every step.
pub struct HybridEngine<'m> {
    model: &'m HybridModel,
    sched: Box<Sched>,
    out: Box<SchedulerOutput<HYBRID_REQUESTS>>,
    stores: Stores,
    live: Vec<Option<Live>>,
    cfg: HybridConfig,
    stats: HybridStats,
}

impl std::fmt::Debug for HybridEngine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HybridEngine")
            .field("cfg", &self.cfg)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<'m> HybridEngine<'m> {
    /// An engine for `model`: `Err` for a configuration the core refuses (`Invalid`).
    pub fn new(model: &'m HybridModel, mut cfg: HybridConfig) -> Result<Self> {
        let spec = model.spec();
        cfg.state.slot_bytes = spec.state_len() as u64 * 4;
        let pool = KvPool::owned_with_prefix_cache(KvPoolConfig {
            tokens_per_block: cfg.tokens_per_block,
            gpu_pages: cfg.pages[0],
            host_pages: cfg.pages[1],
            slots: HYBRID_REQUESTS as u32,
            max_blocks: cfg.pages[0].max(1),
        })?;
        let groups = KvGroups::new([Group {
            attention: Attention::Full,
            pool,
        }])?;
        let kv = Hybrid::new(groups, cfg.state)?;
        let sched = Box::new(Scheduler::new(cfg.scheduler, kv, AdapterPool::new(1, 1)?)?);
        let slots = [cfg.state.gpu_slots, cfg.state.host_slots];
        Ok(Self {
            model,
            sched,
            out: Box::new(SchedulerOutput::new()),
            stores: Stores::new(spec, cfg.tokens_per_block, cfg.pages, slots),
            live: (0..HYBRID_REQUESTS).map(|_| None).collect(),
            cfg,
            stats: HybridStats::default(),
        })
    }

    pub(super) fn stores(&self) -> &Stores {
        &self.stores
    }

    pub(super) fn stores_mut(&mut self) -> &mut Stores {
        &mut self.stores
    }

    /// The counters.
    pub fn stats(&self) -> HybridStats {
        self.stats
    }

    /// The scheduler's backend, read-only (its state pool's counters).
    pub fn backend(&self) -> &Hybrid<KvPool<'static, Owned>, 1, HYBRID_REQUESTS> {
        self.sched.kv()
    }

    /// Submits a request of `prompt` (token ids below the model's vocabulary) for `new` greedy
    /// tokens, with its prompt's block hashes (prefix reuse).
    pub fn submit(&mut self, id: u64, prompt: &[u32], new: usize) -> Result<()> {
        if prompt.is_empty() || new == 0 {
            return Err(EngineError::Batch(
                "a request needs a prompt and a token".into(),
            ));
        }
        if let Some(t) = prompt
            .iter()
            .find(|&&t| t as usize >= self.model.spec().vocab)
        {
            return Err(EngineError::Batch(format!("token {t} past the vocabulary")));
        }
        let mut spec = RequestSpec::new(id, Phase::ContextInit, prompt.len() as u32);
        spec.max_new_tokens = new as u32;
        // FORCE_CHUNK's chunks end at the state's snapshot points (as many as a spec holds).
        let every = self.cfg.state.snapshot_interval as usize;
        for p in (every..prompt.len()).step_by(every.max(1)) {
            if spec.snapshots.push(p as u32).is_err() {
                break;
            }
        }
        let hashes = crate::block_hashes(prompt, self.cfg.tokens_per_block as usize);
        let handle = self.sched.submit_with_prefix(spec, 0, &hashes)?;
        self.live[usize::from(handle.index())] = Some(Live {
            id,
            handle,
            tokens: prompt.to_vec(),
            computed: 0,
            max_new: new,
            generated: Vec::new(),
            logits: Vec::new(),
            cached: 0,
        });
        Ok(())
    }

    /// Whether no request is held.
    pub fn is_empty(&self) -> bool {
        self.live.iter().all(Option::is_none)
    }

    /// Steps until every request finished (`Err` on the scheduler's deadlock or 2,000 idle steps).
    pub fn run(&mut self) -> Result<Vec<HybridCompletion>> {
        let (mut all, mut idle) = (Vec::new(), 0);
        while !self.is_empty() {
            let before = self.stats.steps;
            all.extend(self.step()?);
            idle = if self.stats.steps == before {
                idle + 1
            } else {
                0
            };
            if idle == crate::STALL_STEPS {
                return Err(EngineError::Stalled { steps: idle });
            }
        }
        all.sort_by_key(|c| c.id);
        Ok(all)
    }

    /// One iteration: the pass, the page and state moves, the step over the batch (snapshots
    /// captured on the way), `complete_step`, greedy sampling, replays, poisoning.
    pub fn step(&mut self) -> Result<Vec<HybridCompletion>> {
        self.sched.schedule(&mut self.out)?;
        self.sched.ensure_batch(&mut self.out)?;
        self.stats.suspensions += self.out.paused().len() as u64;
        self.stats.recomputes += self.out.recompute_paused().len() as u64;
        self.stats.preemptions += u64::from(self.sched.last_pass().preemptions);
        self.stores.move_pages(self.sched.take_moves());
        let states = self.sched.take_state_moves();
        self.stats.state_moves += states.len() as u64;
        self.stores.move_states(states);
        let captures = self.sched.take_captures().to_vec();
        let ran = self.run_batch(&captures)?;
        self.sched.complete_step(&self.out)?;
        let done = self.advance(ran);
        self.replay_recomputed()?;
        if self.cfg.poison {
            self.poison();
        }
        self.stats.snapshot_hits = self.sched.kv().state().stats().hits;
        Ok(done)
    }
}

/// What a scheduled row ran: its slot, tokens computed, the logits when it sampled.
struct Ran {
    slot: u16,
    tokens: usize,
    logits: Option<Vec<f32>>,
}

impl HybridEngine<'_> {
    /// Every context chunk and decode step of the pass's output, one sequence at a time.
    fn run_batch(&mut self, captures: &[Capture]) -> Result<Vec<Ran>> {
        let mut rows: Vec<(u16, usize, usize)> = Vec::new();
        for c in self.out.context() {
            let slot = c.listed.slot();
            let start = self.sched.get(c.listed.handle())?.spec().position as usize;
            rows.push((slot, start, c.tokens as usize));
        }
        for l in self.out.generation() {
            let live = self.live_at(l.slot())?;
            rows.push((l.slot(), live.tokens.len() - 1, 1));
        }
        if !rows.is_empty() {
            self.stats.steps += 1;
        }
        rows.into_iter()
            .map(|(slot, start, n)| self.run_one(slot, start, n, captures))
            .collect()
    }

    fn live_at(&self, slot: u16) -> Result<&Live> {
        self.live[usize::from(slot)]
            .as_ref()
            .ok_or_else(|| EngineError::Batch(format!("slot {slot} scheduled with no request")))
    }

    /// Runs `n` tokens of the request in `slot` from `start` on its pages and state slot.
    fn run_one(&mut self, slot: u16, start: usize, n: usize, captures: &[Capture]) -> Result<Ran> {
        let live = self.live[usize::from(slot)]
            .as_mut()
            .ok_or_else(|| EngineError::Batch(format!("slot {slot} scheduled with no request")))?;
        if live.computed == 0 && start > 0 {
            live.cached = start as u32;
            self.stats.reused += start as u64;
        }
        live.computed = start;
        let tokens = live.tokens[start..start + n].to_vec();
        let sample = start + n == live.tokens.len();
        let id = live.id;
        let kv = self.sched.kv();
        let Placement::Gpu(state) = kv.state().placement(slot) else {
            return Err(EngineError::Batch(format!(
                "request {id} scheduled without a live state slot"
            )));
        };
        let pages = crate::serve::gpu_pages(kv.attention().groups()[0].pool.table(slot), slot)?;
        let mine: Vec<Capture> = captures
            .iter()
            .filter(|c| c.request.0 == id && c.position as usize > start)
            .copied()
            .collect();
        self.stats.captures += mine.len() as u64;
        self.stats.tokens += n as u64;
        let mut view = self.stores.view(&pages, state, &mine);
        let logits = self.model.run(&mut view, &tokens, start, sample);
        Ok(Ran {
            slot,
            tokens: n,
            logits,
        })
    }

    /// Each row's tokens computed, a sampled token appended; finished requests removed.
    fn advance(&mut self, ran: Vec<Ran>) -> Vec<HybridCompletion> {
        let mut done = Vec::new();
        for r in ran {
            let Some(live) = self.live[usize::from(r.slot)].as_mut() else {
                continue;
            };
            live.computed += r.tokens;
            if let Some(l) = r.logits {
                let t = argmax(&l);
                live.tokens.push(t);
                live.generated.push(t);
                live.logits.push(l);
            }
            if live.generated.len() == live.max_new {
                let live = self.live[usize::from(r.slot)].take().expect("present");
                let _ = self.sched.remove(live.handle);
                self.stats.requests += 1;
                done.push(HybridCompletion {
                    id: live.id,
                    tokens: live.generated,
                    logits: live.logits,
                    cached: live.cached,
                });
            }
        }
        done
    }

    /// A recompute-paused or preempted request replays its prompt and what it generated.
    fn replay_recomputed(&mut self) -> Result<()> {
        for l in self.out.recompute_paused().to_vec() {
            let Some(live) = self.live[usize::from(l.slot())]
                .as_mut()
                .filter(|x| x.handle == l.handle())
            else {
                continue;
            };
            live.computed = 0;
            let (prompt, left) = (
                live.tokens.len() as u32,
                (live.max_new - live.generated.len()) as u32,
            );
            self.sched.update(live.handle, |s| {
                s.prompt = prompt;
                s.max_new_tokens = left;
            })?;
        }
        Ok(())
    }
}
