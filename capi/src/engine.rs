//! The engine behind the opaque handle: the page pool (owning its buffers), the adapter cache, the
//! scheduler and its output (their arrays on the heap, built in place), and the plain-old-data copies
//! of the output that C reads. Safe Rust: the engine owns everything it holds.

use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::delta::BatchDelta;
use kvsched_core::error::Error;
use kvsched_core::ids::{RequestId, TaskId};
use kvsched_core::kv::Tier;
use kvsched_core::output::{Listed, SchedulerOutput};
use kvsched_core::page_pool::{KvPool, KvPoolConfig};
use kvsched_core::request::RequestSpec;
use kvsched_core::scheduler::{Handle, TransferEnd};
use kvsched_core::storage::Boxed;
use kvsched_core::Phase;

use crate::sched::{Output, Sched, MAX_REQUESTS};
use crate::state::{KvschedCapture, KvschedStateMove};
use crate::{KvschedConfig, KvschedEntry, KvschedKvEvent, KvschedPageMove, KvschedRequest};

/// The last pass's output, copied into plain-old-data lists (what the bindings read).
#[derive(Debug, Default)]
pub struct Lists {
    /// Context chunks to run.
    pub context: Vec<KvschedEntry>,
    /// Decode steps to run.
    pub generation: Vec<KvschedEntry>,
    /// Suspended this pass.
    pub paused: Vec<KvschedEntry>,
    /// Recompute-paused this pass (KV freed).
    pub recompute_paused: Vec<KvschedEntry>,
    /// Disaggregated generation requests whose pages are ready.
    pub disagg: Vec<KvschedEntry>,
    /// Scheduled requests whose KV came back from the host tier.
    pub resumed: Vec<KvschedEntry>,
    /// Adapters to load onto the device (task ids), after [`Engine::ensure_batch`].
    pub adapter_loads: Vec<u64>,
    /// The page moves of the last [`Engine::take_moves`].
    pub moves: Vec<KvschedPageMove>,
    /// The KV events of the last [`Engine::take_kv_events`] (room for the log's capacity, reserved
    /// once).
    pub kv_events: Vec<KvschedKvEvent>,
    /// The last [`Engine::take_delta`]: requests that entered the batch, left it, changed in it.
    pub entered: Vec<KvschedEntry>,
    /// See `entered`.
    pub left: Vec<KvschedEntry>,
    /// See `entered`.
    pub changed: Vec<KvschedEntry>,
    /// The state moves of the last [`Engine::take_state_moves`].
    pub state_moves: Vec<KvschedStateMove>,
    /// The captures of the last [`Engine::take_captures`].
    pub captures: Vec<KvschedCapture>,
}

/// One scheduler with its pools.
pub struct Engine {
    pub(crate) sched: Sched,
    out: Output,
    pub(crate) lists: Lists,
    delta: BatchDelta<MAX_REQUESTS, Boxed>,
    /// By slot: the entry the batch of the last delta showed (what a request that left it was).
    shown: Vec<Option<KvschedEntry>>,
    /// By slot: where the current batch's entry is in the context list followed by the generation
    /// list (written for the batch's slots before each delta is read).
    at: Vec<usize>,
    /// A panic left the engine in an unknown state: every later call is refused.
    pub(crate) poisoned: bool,
    /// The configuration it was built for (its errors' messages name its settings).
    config: KvschedConfig,
    /// The last refusal's words where its error cannot carry them (too many block hashes: the
    /// counts), for [`Engine::message`].
    refusal: String,
}

/// The error of a submit with more block hashes than its prompt has full pages.
const TOO_MANY_HASHES: &str = "more block hashes than the prompt has full pages";

impl Engine {
    /// An engine for `c`; refused (nothing kept) for an inconsistent configuration or memory that
    /// cannot be had. The fixed-capacity tables (about 0.5 MB, and a hybrid engine's state pool)
    /// are built in place on the heap: any caller's stack will do.
    pub fn new(c: &KvschedConfig) -> Result<Self, Error> {
        if c.max_requests == 0 || c.max_requests as usize > MAX_REQUESTS {
            return Err(Error::Invalid("max_requests must be 1 to 1024"));
        }
        let pool_cfg = KvPoolConfig {
            tokens_per_block: c.tokens_per_block,
            gpu_pages: c.gpu_pages,
            host_pages: c.host_pages,
            slots: c.max_requests,
            max_blocks: c.max_blocks_per_request,
        };
        let cfg = crate::config::scheduler_config(c)?;
        cfg.validate()?;
        let state = crate::config::state_of(c)?;
        let adapters = AdapterPool::new(c.adapter_device_pages, c.adapter_host_pages)?;
        let mut pool = if c.prefix_cache != 0 {
            KvPool::owned_with_prefix_cache(pool_cfg)?
        } else if c.kv_events > 0 {
            return Err(Error::Invalid("a KV event log needs the prefix cache"));
        } else {
            KvPool::owned(pool_cfg)?
        };
        let mut lists = Lists::default();
        if c.kv_events > 0 {
            pool = pool.with_kv_events(c.kv_events as usize)?;
            lists
                .kv_events
                .try_reserve_exact(c.kv_events as usize)
                .map_err(|_| Error::CapacityExhausted {
                    what: "memory for the KV event list",
                    capacity: c.kv_events,
                })?;
        }
        Ok(Self {
            sched: Sched::new(cfg, pool, adapters, state)?,
            out: SchedulerOutput::new_in()?,
            lists,
            delta: BatchDelta::new_in()?,
            shown: vec![None; MAX_REQUESTS],
            at: vec![0; MAX_REQUESTS],
            poisoned: false,
            config: *c,
            refusal: String::new(),
        })
    }

    /// The message of an error one of this engine's calls returned; `id` is the request the call
    /// named, if it named one. The core's message, made specific where the engine knows more: an
    /// unknown id is named, and a request too large for its page table (or for the whole pool) is told
    /// the limit in pages and tokens and the configuration field that raises it.
    pub fn message(&self, e: &Error, id: Option<u64>) -> String {
        let c = &self.config;
        let pages = c.max_blocks_per_request.min(c.gpu_pages);
        match *e {
            Error::StaleHandle => match id {
                Some(id) => format!(
                    "request id {id} names no live request (never submitted, or finished already)"
                ),
                None => e.to_string(),
            },
            Error::RequestTooLarge { id, tokens, limit }
                if limit == u64::from(pages) * u64::from(c.tokens_per_block) =>
            {
                let (what, field) = if c.max_blocks_per_request <= c.gpu_pages {
                    ("its page-table limit", "max_blocks_per_request")
                } else {
                    ("the whole KV pool", "gpu_pages")
                };
                format!(
                    "request {} needs {tokens} KV tokens but one request can hold at most {limit}: \
                     {what}, {field} = {pages} pages of {} tokens; raise {field} in the \
                     configuration, or shorten the request",
                    id.0, c.tokens_per_block
                )
            }
            Error::Invalid(TOO_MANY_HASHES) if !self.refusal.is_empty() => self.refusal.clone(),
            _ => e.to_string(),
        }
    }

    /// Registers an adapter of `pages` device pages under `task`.
    pub fn register_adapter(&mut self, task: u64, pages: u32) -> Result<(), Error> {
        self.sched
            .register_adapter(TaskId(task), pages)
            .map_err(Error::from)
    }

    fn handle(&self, id: u64) -> Result<Handle, Error> {
        self.sched.find(RequestId(id)).ok_or(Error::StaleHandle)
    }

    /// Submits a request with its prompt's block hashes. Refused with
    /// [`Error::CapacityExhausted`] when the engine already holds `max_requests` requests (the core
    /// refuses a request beyond the pool's rows, `KvLimits::slots`).
    pub fn submit(&mut self, r: &KvschedRequest, hashes: &[u64]) -> Result<(), Error> {
        let phase = match r.kind {
            1 => Phase::ContextInit,
            2 => Phase::DisaggGenerationInit,
            0 => Phase::ContextInit,
            _ => {
                return Err(Error::Invalid(
                    "kind must be 0 (plain), 1 (context-only) or 2 (disaggregated generation)",
                ))
            }
        };
        // One hash a full page of the prompt.
        let (tpb, n) = (self.config.tokens_per_block, hashes.len());
        let full = r.prompt / tpb;
        if n > full as usize {
            self.refusal = format!(
                "request {}: {n} block hashes, but a prompt of {} tokens has {full} full pages of \
                 {tpb} tokens (prompt / tokens_per_block): give one hash a full page, at most {full}",
                r.id, r.prompt
            );
            return Err(Error::Invalid(TOO_MANY_HASHES));
        }
        let mut s = RequestSpec::new(r.id, phase, r.prompt);
        s.context_only = r.kind == 1;
        s.max_new_tokens = r.max_new_tokens;
        s.beam = r.beam.max(1);
        s.draft = r.draft;
        s.lora = (r.has_lora != 0).then_some(TaskId(r.lora_task));
        s.priority = r.priority;
        s.class = r.service_class;
        s.arrival = r.arrival;
        self.sched
            .submit_with_prefix(s, r.cache_salt, hashes)
            .map(|_| ())
    }

    /// Forks a child (`r`: its id, its prompt, which the caller vouches are `parent`'s first
    /// `r.prompt` tokens, its output; its adapter the parent's) off request `parent`
    /// (`Scheduler::fork`): it starts active on the parent's full pages. Returns the prompt
    /// positions it shares (its position). Refused as the core refuses: a parent not active, a
    /// pool without a prefix cache, a child not its parent's.
    pub fn fork(&mut self, parent: u64, r: &KvschedRequest) -> Result<u32, Error> {
        if self.sched.hybrid().is_some() {
            return Err(Error::Invalid(
                "a hybrid engine (state_gpu_slots > 0) cannot fork: a child would need the \
                 recurrent state at the shared block boundary, which no slot holds",
            ));
        }
        if r.kind != 0 {
            return Err(Error::Invalid("a fork's child is a plain request (kind 0)"));
        }
        let h = self.handle(parent)?;
        let parent_spec = self.sched.get(h)?.spec();
        let (tenant, class) = (parent_spec.tenant, parent_spec.class);
        let mut s = RequestSpec::new(r.id, Phase::ContextInit, r.prompt);
        s.max_new_tokens = r.max_new_tokens;
        s.beam = r.beam.max(1);
        s.draft = r.draft;
        s.lora = (r.has_lora != 0).then_some(TaskId(r.lora_task));
        (s.tenant, s.priority, s.arrival) = (tenant, r.priority, r.arrival);
        s.class = class;
        let child = self.sched.fork(h, s)?;
        Ok(self.sched.get(child)?.spec().position)
    }

    /// Removes a finished or cancelled request.
    pub fn finish(&mut self, id: u64) -> Result<(), Error> {
        let h = self.handle(id)?;
        self.sched.remove(h).map(|_| ())
    }

    /// Marks a request in flight (skipped by the pass) or not.
    pub fn set_inflight(&mut self, id: u64, inflight: bool) -> Result<(), Error> {
        let h = self.handle(id)?;
        self.sched.set_inflight(h, inflight)
    }

    /// The last pass's output, as plain-old-data lists.
    pub fn lists(&self) -> &Lists {
        &self.lists
    }

    /// Runs a pass and copies its output into the lists (the adapter loads come with
    /// [`Engine::ensure_batch`]). An incremental pass kept the last pass's lists: so are the copies
    /// (nothing is copied, the arrays C holds stay valid and unchanged).
    pub fn schedule(&mut self) -> Result<(), Error> {
        let replayed = self.sched.replayed_passes();
        self.sched.schedule(&mut self.out)?;
        if self.sched.replayed_passes() > replayed {
            self.lists.adapter_loads.clear();
            return Ok(());
        }
        let (s, o, l) = (&self.sched, &self.out, &mut self.lists);
        let entry = |x: &Listed, tokens: u32, last: bool| {
            let e = s.get(x.handle()).ok();
            let lora = e.and_then(|e| e.spec().lora);
            KvschedEntry {
                id: e.map_or(u64::MAX, |e| e.spec().id.0),
                lora_task: lora.map_or(0, |t| t.0),
                tokens,
                slot: x.slot(),
                has_lora: u8::from(lora.is_some()),
                last: u8::from(last),
                state_slot: s.state_slot(x.slot()),
            }
        };
        l.context.clear();
        l.context.extend(
            o.context()
                .iter()
                .map(|c| entry(&c.listed, c.tokens, c.last)),
        );
        for (list, src) in [
            (&mut l.generation, o.generation()),
            (&mut l.paused, o.paused()),
            (&mut l.recompute_paused, o.recompute_paused()),
            (&mut l.disagg, o.disagg()),
            (&mut l.resumed, o.resumed()),
        ] {
            list.clear();
            list.extend(src.iter().map(|x| entry(x, 0, false)));
        }
        l.adapter_loads.clear();
        Ok(())
    }

    /// What changed in the batch since the last call ([`kvsched_core::delta`]): the requests that
    /// entered it, left it (as they were then: a removed one keeps its id) and changed in it (a
    /// context chunk with its tokens, or a request now in another list), as plain-old-data lists.
    pub fn take_delta(&mut self) -> Result<(), Error> {
        self.sched.take_delta(&self.out, &mut self.delta)?;
        let Lists {
            context,
            generation,
            entered,
            left,
            changed,
            ..
        } = &mut self.lists;
        let (at, shown) = (&mut self.at, &mut self.shown);
        // The batch's entries are the lists' copies: indexed by slot, once.
        for (k, e) in context.iter().chain(generation.iter()).enumerate() {
            at[usize::from(e.slot)] = k;
        }
        let batch = |x: &Listed| {
            let k = at[usize::from(x.slot())];
            let e = if k < context.len() {
                context[k]
            } else {
                generation[k - context.len()]
            };
            assert_eq!(e.slot, x.slot(), "a delta's entry is in the batch");
            e
        };
        left.clear();
        for x in self.delta.left() {
            let was = shown[usize::from(x.slot())].take();
            left.push(was.expect("a request that left the batch had entered it"));
        }
        for (list, src) in [
            (&mut *entered, self.delta.entered()),
            (&mut *changed, self.delta.changed()),
        ] {
            list.clear();
            for x in src {
                let e = batch(x);
                shown[usize::from(x.slot())] = Some(e);
                list.push(e);
            }
        }
        Ok(())
    }

    /// Passes that were incremental (the last pass's batch kept: no list copied).
    pub fn replayed_passes(&self) -> u64 {
        self.sched.replayed_passes()
    }

    /// The pass the last delta leads to.
    pub fn delta_pass(&self) -> u64 {
        self.delta.pass()
    }

    /// Makes the last pass's adapters resident: the task ids to load onto the device.
    pub fn ensure_batch(&mut self) -> Result<&[u64], Error> {
        self.sched.ensure_batch(&mut self.out)?;
        let l = &mut self.lists;
        l.adapter_loads.clear();
        l.adapter_loads
            .extend(self.out.adapter_loads().iter().map(|t| t.id.0));
        Ok(&l.adapter_loads)
    }

    /// The page moves since the last call, copied for the copy engine.
    pub fn take_moves(&mut self) -> &[KvschedPageMove] {
        let moves = self.sched.take_moves();
        self.lists.moves.clear();
        self.lists
            .moves
            .extend(moves.iter().map(|m| KvschedPageMove {
                request: m.request.0,
                src: m.src,
                dst: m.dst,
                from_host: u8::from(m.from == Tier::Host),
            }));
        &self.lists.moves
    }

    /// The KV events since the last call, copied for the engine's publisher.
    pub fn take_kv_events(&mut self) -> &[KvschedKvEvent] {
        let events = self.sched.take_kv_events();
        let l = &mut self.lists.kv_events;
        l.clear();
        l.extend(events.iter().map(KvschedKvEvent::of));
        l
    }

    /// The root a live request's prompt keys chain from.
    pub fn prefix_root(&self, id: u64) -> Result<u64, Error> {
        let h = self.handle(id)?;
        Ok(self.sched.pool().seq(h.index()).root)
    }

    /// Completes the last pass's step.
    pub fn complete_step(&mut self) -> Result<(), Error> {
        self.sched.complete_step(&self.out)
    }

    /// A request's page table (GPU page ids; a host page carries the pool's host tag).
    pub fn page_table(&self, id: u64) -> Result<&[u32], Error> {
        let h = self.handle(id)?;
        Ok(self.sched.pool().table(h.index()))
    }

    /// Disaggregated serving: a context-only request's send ended.
    pub fn end_send(&mut self, id: u64, delivered: bool) -> Result<(), Error> {
        let h = self.handle(id)?;
        self.sched.end_send(h, end(delivered))
    }

    /// Disaggregated serving: the receive into a prepared generation request's pages starts.
    pub fn start_receive(&mut self, id: u64) -> Result<(), Error> {
        let h = self.handle(id)?;
        self.sched.start_receive(h)
    }

    /// Disaggregated serving: a generation request's receive ended.
    pub fn end_receive(&mut self, id: u64, delivered: bool) -> Result<(), Error> {
        let h = self.handle(id)?;
        self.sched.end_receive(h, end(delivered))
    }

    /// Live requests.
    pub fn len(&self) -> usize {
        self.sched.len()
    }

    /// No live request.
    pub fn is_empty(&self) -> bool {
        self.sched.len() == 0
    }

    /// Free GPU pages.
    pub fn gpu_free(&self) -> u32 {
        self.sched.pool().gpu_free()
    }

    /// A fingerprint of everything a call may change: the scheduler's state, the KV pool's (page tables,
    /// free stacks, prefix cache, event log), a hybrid engine's state pool's, the adapter cache's, the
    /// last output and the lists the C ABI hands out, and the poison flag. Equal before and after a refused call = it changed nothing
    /// (the fuzz target `capi` checks every refusal so). Costs a pass over the pool's buffers: for
    /// tests, not for a serving loop.
    pub fn fingerprint(&self) -> u64 {
        use std::hash::{DefaultHasher, Hash, Hasher};
        let mut h = DefaultHasher::new();
        self.sched.fingerprint(&mut h);
        self.out.pass().hash(&mut h);
        let l = &self.lists;
        for list in [
            &l.context,
            &l.generation,
            &l.paused,
            &l.recompute_paused,
            &l.disagg,
            &l.resumed,
        ] {
            list.hash(&mut h);
        }
        l.adapter_loads.hash(&mut h);
        l.moves.hash(&mut h);
        l.kv_events.hash(&mut h);
        l.state_moves.hash(&mut h);
        l.captures.hash(&mut h);
        self.poisoned.hash(&mut h);
        h.finish()
    }

    /// The pass number of the last output.
    pub fn pass(&self) -> u64 {
        self.out.pass()
    }
}

fn end(delivered: bool) -> TransferEnd {
    if delivered {
        TransferEnd::Delivered
    } else {
        TransferEnd::Failed
    }
}
