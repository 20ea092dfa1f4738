//! The engine's thread: it owns the [`Engine`], takes requests from a queue while the engine holds
//! fewer than its scheduler's `max_num_requests`, steps, and sends each request's new tokens to its
//! handler.
//!
//! Admission counts requests, not queue places: a request is taken at once while fewer than
//! `max_num_requests + depth` are admitted (waiting or in the engine), whether or not the engine
//! is between steps, and refused (429) only past that. Each admitted request holds a [`Ticket`]
//! from [`Worker::submit`] until it ends, however it ends. A handler that went away
//! (its client disconnected, or a stop string ended its text) closes its channel; the next step
//! cancels its request, so the scheduler frees its pages and returns its adapter lease.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvsched_engine::{
    Completion, Engine, EngineConfig, EngineLoad, EngineStats, Finish, Lora, Model, Sample,
    STALL_STEPS,
};
use tokio::sync::mpsc::UnboundedSender;

use crate::error::StartError;

/// How long an idle engine thread waits for a request before it looks at its flags again.
const IDLE_POLL: Duration = Duration::from_millis(20);

/// How often a drain looks whether the admitted requests are done.
const DRAIN_POLL: Duration = Duration::from_millis(10);

pub use crate::job::{End, Event, Job, Mode};

/// An admitted request's place: taken by [`Worker::submit`], given back when dropped (the request
/// ended, was cancelled or refused by the engine).
#[derive(Debug)]
pub struct Ticket(Arc<Shared>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.admitted.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An operation on the engine, run between two steps.
#[derive(Debug)]
pub enum Control {
    /// Drop the prefix cache's idle blocks (`POST /reset_prefix_cache`); the reply: how many.
    ResetPrefixCache(tokio::sync::oneshot::Sender<u32>),
    /// Register an adapter's weights under an engine id and its served name, which its KV
    /// events carry (`POST /v1/load_lora_adapter`).
    LoadAdapter {
        /// The engine id.
        id: u64,
        /// The served name.
        name: String,
        /// The weights.
        lora: Box<Lora>,
        /// The engine's answer.
        reply: Reply,
    },
    /// Retire an adapter (`POST /v1/unload_lora_adapter`): no request holds it.
    UnloadAdapter(u64, Reply),
}

/// Where the engine thread answers an adapter operation.
pub type Reply = tokio::sync::oneshot::Sender<kvsched_engine::Result<()>>;

/// What the engine thread last saw, for `/metrics`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Snapshot {
    /// Requests and pages.
    pub load: EngineLoad,
    /// The engine's counters.
    pub stats: EngineStats,
}

/// State the engine thread shares with the handlers.
#[derive(Debug, Default)]
pub struct Shared {
    /// Jobs in the queue, not yet in the engine.
    pub queued: AtomicUsize,
    /// Requests admitted and not ended: queued or in the engine.
    pub admitted: AtomicUsize,
    /// Abort every request now (shutdown past its deadline).
    pub abort: AtomicBool,
    /// Stop once the queue and the engine are empty.
    pub stop: AtomicBool,
    /// The latest snapshot.
    pub snapshot: Mutex<Snapshot>,
}

/// The handle to the engine thread.
#[derive(Debug)]
pub struct Worker {
    queue: SyncSender<Job>,
    controls: std::sync::mpsc::Sender<Control>,
    /// Shared with the thread.
    pub shared: Arc<Shared>,
    /// The engine's requests at once (its scheduler's `max_num_requests`).
    slots: usize,
    /// Requests that may wait beyond them.
    depth: usize,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// Why [`Worker::admit`] or [`Worker::submit`] refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Every engine slot and every queue place is taken: `(slots, depth)`.
    Full(usize, usize),
    /// The engine thread is gone.
    Gone,
}

impl Worker {
    /// Starts the engine thread over `model` with `config` and `adapters` (engine id, weights),
    /// behind a queue of `depth` jobs. Fails if the engine refuses the configuration or an adapter.
    pub fn start(
        model: Arc<Model>,
        config: EngineConfig,
        adapters: Vec<(u64, Lora)>,
        depth: usize,
        kv_events: Option<crate::kv_events::Publisher>,
    ) -> Result<Self, StartError> {
        let slots = config.scheduler.max_num_requests as usize;
        // Never full: admission (`slots + depth` tickets) bounds what is in it.
        let (queue, jobs) = std::sync::mpsc::sync_channel(slots + depth);
        let (controls, inbox) = std::sync::mpsc::channel();
        let (ready, started) = std::sync::mpsc::channel();
        let shared = Arc::new(Shared::default());
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("kvsched-engine".into())
            .spawn(move || {
                let engine = Engine::new(&model, config).and_then(|mut e| {
                    for (id, lora) in &adapters {
                        e.register_adapter(*id, lora)?;
                    }
                    Ok(e)
                });
                match engine {
                    Ok(engine) => {
                        let run = Loop::new(engine, (jobs, inbox), thread_shared, kv_events);
                        // The pool's size is in /metrics before the server takes a request.
                        run.publish();
                        let _ = ready.send(Ok(()));
                        run.run();
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e.to_string()));
                    }
                }
            })
            .map_err(|e| StartError::Thread("engine", e))?;
        started
            .recv()
            .map_err(|_| StartError::Engine("the engine thread stopped while starting".into()))?
            .map_err(StartError::Engine)?;
        Ok(Self {
            queue,
            controls,
            shared,
            slots,
            depth,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The engine's requests at once: the most samples one request may draw.
    pub const fn slots(&self) -> usize {
        self.slots
    }

    /// A place for one more request: refused only when `slots + depth` requests are admitted
    /// already. Taken before the request is read, so a refusal costs nothing.
    pub fn admit(&self) -> Result<Ticket, Refused> {
        let capacity = self.slots + self.depth;
        let taken = self
            .shared
            .admitted
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < capacity).then_some(n + 1)
            });
        match taken {
            Ok(_) => Ok(Ticket(Arc::clone(&self.shared))),
            Err(_) => Err(Refused::Full(self.slots, self.depth)),
        }
    }

    /// Queues `job` (its ticket from [`Worker::admit`]); refused only when the engine thread is
    /// gone.
    pub fn submit(&self, job: Job) -> Result<(), Refused> {
        self.shared.queued.fetch_add(1, Ordering::SeqCst);
        match self.queue.try_send(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                debug_assert!(
                    matches!(e, TrySendError::Disconnected(_)),
                    "admission bounds the queue"
                );
                Err(Refused::Gone)
            }
        }
    }

    /// Runs `c` on the engine between two steps (within the idle poll when it is idle); refused when
    /// the engine thread is gone.
    pub fn control(&self, c: Control) -> Result<(), Refused> {
        self.controls.send(c).map_err(|_| Refused::Gone)
    }

    /// Tells the thread to stop once idle and waits for it.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    /// Lets the admitted requests run on until none is left, or `deadline`, when the rest are aborted
    /// (a shutdown's drain: `kvsched serve`'s, the Dynamo worker's `cleanup`).
    pub async fn drain(&self, deadline: Duration) {
        let until = tokio::time::Instant::now() + deadline;
        while self.shared.admitted.load(Ordering::SeqCst) > 0 {
            if tokio::time::Instant::now() >= until {
                self.abort();
                return;
            }
            tokio::time::sleep(DRAIN_POLL).await;
        }
    }

    /// What the engine thread last saw, and the jobs queued for it: what `/metrics` renders.
    pub fn snapshot(&self) -> (Snapshot, usize) {
        let snapshot = self.shared.snapshot.lock().map(|s| *s).unwrap_or_default();
        (snapshot, self.shared.queued.load(Ordering::SeqCst))
    }

    /// Aborts every request now: each handler gets [`End::Abort`].
    pub fn abort(&self) {
        self.shared.abort.store(true, Ordering::SeqCst);
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.abort();
        self.stop();
    }
}

/// A request in the engine: where its events go and how many of its tokens were sent.
struct Live {
    events: UnboundedSender<Event>,
    sent: usize,
    /// Whether a step ran it yet.
    scheduled: bool,
    /// Its places among the admitted requests (a beam search's: one per beam).
    tickets: Vec<Ticket>,
    /// A beam search: its result comes whole ([`Event::Beams`]), no tokens before.
    beams: bool,
    /// Its request's hold on its adapter (shared by its samples).
    _hold: Option<Arc<crate::adapters::Held>>,
}

/// The engine thread's loop.
struct Loop<'m> {
    engine: Engine<'m>,
    jobs: Receiver<Job>,
    controls: Receiver<Control>,
    shared: Arc<Shared>,
    live: HashMap<u64, Live>,
    /// A job taken from the queue whose samples the engine has no room for yet.
    next: Option<Job>,
    /// Consecutive steps that ran no model step.
    stalled: u32,
    /// Where each step's KV events go (`--kv-events`).
    kv_events: Option<crate::kv_events::Publisher>,
}

impl<'m> Loop<'m> {
    fn new(
        engine: Engine<'m>,
        (jobs, controls): (Receiver<Job>, Receiver<Control>),
        shared: Arc<Shared>,
        kv_events: Option<crate::kv_events::Publisher>,
    ) -> Self {
        Self {
            engine,
            jobs,
            controls,
            shared,
            live: HashMap::new(),
            next: None,
            stalled: 0,
            kv_events,
        }
    }

    fn run(mut self) {
        loop {
            if self.shared.abort.load(Ordering::SeqCst) {
                self.abort_all();
            }
            while let Ok(c) = self.controls.try_recv() {
                self.apply(c);
            }
            if !self.admit() {
                return;
            }
            if self.engine.is_empty() {
                if self.shared.stop.load(Ordering::SeqCst)
                    && self.shared.queued.load(Ordering::SeqCst) == 0
                {
                    return;
                }
                continue;
            }
            let before = self.engine.stats().model_steps;
            let began = Instant::now();
            match self.engine.step() {
                Ok(done) => {
                    self.mark_scheduled(began, &done);
                    // /metrics first: a client that saw this step's tokens reads this step's load.
                    self.publish();
                    self.send(&done);
                    self.send_beams();
                }
                Err(e) => self.fail_all(&e.to_string()),
            }
            self.stalled = if self.engine.stats().model_steps == before {
                self.stalled + 1
            } else {
                0
            };
            if self.stalled == STALL_STEPS {
                self.fail_all(&format!(
                    "the scheduler ran no request for {STALL_STEPS} steps"
                ));
            }
            self.cancel_closed();
            if let Some(p) = &self.kv_events {
                p.publish(&self.engine.take_kv_events());
            }
            self.publish();
        }
    }

    /// Moves jobs from the queue into the engine while it has room for each one's samples (a job
    /// that does not fit waits at the head of the queue; an idle engine takes any); waits a little
    /// when the engine is idle. `false` once every sender is gone and nothing is left. Under
    /// priority scheduling or with service classes the engine takes every admitted request (its
    /// scheduler orders them and runs `--max-num-seqs` at once), so a later request of higher
    /// priority, or of a class within its share, is not queued here.
    fn admit(&mut self) -> bool {
        let sched = &self.engine.config().scheduler;
        let by_scheduler =
            sched.admission == kvsched_core::config::Admission::Priority || sched.shares.is_some();
        let room = if by_scheduler {
            kvsched_engine::MAX_REQUESTS
        } else {
            sched.max_num_requests as usize
        };
        loop {
            let used = self.engine.len() + self.engine.waiting_samples();
            if let Some(job) = self.next.take() {
                if used > 0 && used + job.samples.len() > room {
                    self.next = Some(job);
                    return true;
                }
                self.start(job);
                continue;
            }
            if used >= room {
                return true;
            }
            let job = if self.engine.is_empty() {
                match self.jobs.recv_timeout(IDLE_POLL) {
                    Ok(job) => job,
                    Err(RecvTimeoutError::Timeout) => return true,
                    Err(RecvTimeoutError::Disconnected) => return false,
                }
            } else {
                match self.jobs.try_recv() {
                    Ok(job) => job,
                    Err(_) => return true,
                }
            };
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            self.next = Some(job);
        }
    }

    fn start(&mut self, job: Job) {
        if job.samples.iter().all(|(_, events, _)| events.is_closed()) {
            return;
        }
        let (samples, routes): (Vec<Sample>, Vec<_>) = job
            .samples
            .into_iter()
            .map(|(sample, events, ticket)| (sample, (events, ticket)))
            .unzip();
        if self.shared.abort.load(Ordering::SeqCst) {
            for (events, _) in routes {
                let _ = events.send(Event::Done(End::Abort));
            }
            return;
        }
        let hold = job.hold.map(Arc::new);
        let (prompt, salt, adapter) = (&job.prompt, job.cache_salt, job.adapter);
        let (priority, class) = (job.priority, job.class);
        let started = match job.mode {
            Mode::Samples => {
                self.engine
                    .submit_samples(prompt, job.max_new, adapter, samples, salt)
            }
            Mode::Beams(params) => self
                .engine
                .submit_beam_search(prompt, job.max_new, adapter, params, salt)
                .map(|id| vec![id]),
        };
        // Samples run alone take them now; forks take their first sample's (beams carry theirs).
        let started = started.and_then(|ids| {
            for &id in &ids {
                self.engine.set_priority(id, priority)?;
                self.engine.set_service_class(id, class)?;
            }
            Ok(ids)
        });
        let ids = match started {
            Ok(ids) => ids,
            Err(e) => {
                for (events, _) in routes {
                    let _ = events.send(Event::Failed(e.to_string()));
                }
                return;
            }
        };
        let beams = matches!(job.mode, Mode::Beams(_));
        let mut routes = routes.into_iter();
        for id in ids {
            let Some((events, ticket)) = routes.next() else {
                break;
            };
            let mut tickets = vec![ticket];
            if beams {
                tickets.extend(routes.by_ref().map(|(_, t)| t));
            }
            let live = Live {
                events,
                sent: 0,
                scheduled: false,
                tickets,
                beams,
                _hold: hold.clone(),
            };
            self.live.insert(id, live);
        }
    }

    /// Tells each request the step that began at `began` ran first that it was scheduled: its KV
    /// holds positions, or it finished.
    fn mark_scheduled(&mut self, began: Instant, done: &[Completion]) {
        for (&id, live) in &mut self.live {
            if live.scheduled {
                continue;
            }
            // A sample waiting for its first sample's prompt is neither in the engine nor done.
            let cached = match self.engine.kv_extent(id) {
                Some(kv) if kv.computed == 0 => continue,
                Some(_) => self.engine.cached_tokens(id).unwrap_or(0),
                None => match done.iter().find(|c| c.id == id) {
                    Some(c) => c.cached_tokens,
                    None => continue,
                },
            };
            live.scheduled = true;
            let _ = live.events.send(Event::Scheduled(began, cached));
        }
    }

    /// New tokens to every running request; the finished ones' last tokens and their end.
    fn send(&mut self, done: &[Completion]) {
        for (&id, live) in &mut self.live {
            if live.beams {
                continue;
            }
            if let Some(tokens) = self.engine.tokens(id) {
                if tokens.len() > live.sent {
                    let lps = self.engine.logprobs(id).unwrap_or_default();
                    let _ = live.events.send(Event::Tokens(
                        tokens[live.sent..].to_vec(),
                        lps.get(live.sent..).unwrap_or_default().to_vec(),
                    ));
                    live.sent = tokens.len();
                }
            }
        }
        for c in done {
            if let Some(live) = self.live.remove(&c.id) {
                // The place is free before the handler hears of the end: a client that sends its
                // next request on it finds the place.
                drop(live.tickets);
                if c.tokens.len() > live.sent {
                    let _ = live.events.send(Event::Tokens(
                        c.tokens[live.sent..].to_vec(),
                        c.logprobs.get(live.sent..).unwrap_or_default().to_vec(),
                    ));
                }
                let end = match c.finish {
                    Finish::Stop => End::Stop,
                    Finish::Length => End::Length,
                };
                let _ = live.events.send(Event::Done(end));
            }
        }
    }

    /// Each beam search that ended: its sequences, then its end.
    fn send_beams(&mut self) {
        for r in self.engine.take_beam_results() {
            if let Some(live) = self.live.remove(&r.id) {
                drop(live.tickets);
                let _ = live.events.send(Event::Beams(r.sequences));
                let _ = live.events.send(Event::Done(End::Stop));
            }
        }
    }

    /// Cancels the requests whose handler went away.
    fn cancel_closed(&mut self) {
        let closed: Vec<u64> = self
            .live
            .iter()
            .filter(|(_, l)| l.events.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in closed {
            self.live.remove(&id);
            if let Err(e) = self.engine.cancel(id) {
                eprintln!("kvsched serve: cancelling request {id}: {e}");
            }
        }
    }

    fn apply(&mut self, c: Control) {
        match c {
            Control::ResetPrefixCache(reply) => {
                let dropped = self.engine.reset_prefix_cache();
                if let Some(p) = &self.kv_events {
                    p.publish(&self.engine.take_kv_events());
                }
                self.publish();
                let _ = reply.send(dropped);
            }
            Control::LoadAdapter {
                id,
                name,
                lora,
                reply,
            } => {
                let done = self.engine.register_adapter(id, &lora);
                if let (Ok(()), Some(p)) = (&done, &mut self.kv_events) {
                    p.name_adapter(id, name);
                }
                let _ = reply.send(done);
            }
            Control::UnloadAdapter(id, reply) => {
                let done = self.engine.unregister_adapter(id);
                self.publish();
                let _ = reply.send(done);
            }
        }
    }

    fn abort_all(&mut self) {
        for (id, live) in std::mem::take(&mut self.live) {
            let _ = live.events.send(Event::Done(End::Abort));
            let _ = self.engine.cancel(id);
        }
        self.publish();
    }

    /// A failed step fails every request in it (the engine's state is not trusted after it).
    fn fail_all(&mut self, why: &str) {
        eprintln!("kvsched serve: the engine failed a step: {why}");
        for (id, live) in std::mem::take(&mut self.live) {
            let _ = live.events.send(Event::Failed(why.to_string()));
            let _ = self.engine.cancel(id);
        }
    }

    fn publish(&self) {
        let snapshot = Snapshot {
            load: self.engine.load(),
            stats: self.engine.stats(),
        };
        if let Ok(mut s) = self.shared.snapshot.lock() {
            *s = snapshot;
        }
    }
}
