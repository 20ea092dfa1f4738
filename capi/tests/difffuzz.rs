//! A differential fuzz of the C ABI against the core in process (RELIABILITY.md, "Differential fuzz",
//! part c).
//!
//! A random configuration (page size, GPU and host pages, page-table length, request table, batch and
//! token budgets, chunking, recompute pause, prefix cache, adapter cache) and a random script of the
//! operations the two share — submit (prompt, output length, beam, drafts, adapter, cache salt and
//! block hashes, priority, arrival, plain / context-only / disaggregated generation), schedule (the
//! pass and its adapter plan), take the page moves, complete the step, finish, mark in flight, and the
//! transfers' start and ends — run through the `extern "C"` functions and, beside them, on the core's
//! `Scheduler` over a `KvPool` and an `AdapterPool` built from the header's documented meaning of each
//! field, twice: with the incremental pass (as the engine runs) and with full passes only. After every
//! operation the three must agree on its status (the core's error mapped to the documented code),
//! and after every pass on each list entry field by field (id, adapter, tokens, slot, last chunk: the
//! context, generation, paused, recompute-paused, disaggregated and resumed lists, and the adapter
//! loads); after every operation on the page moves taken, the live requests, the free GPU pages and
//! every live request's page table.
//!
//! The scenario format's scripted pools have no C counterpart, so this part does not run scenario
//! files: its vocabulary is the C ABI's (the subset above; KV events, deltas and the prefix root are
//! left out). On a difference the case is printed as JSON. `cargo test` runs 128 cases;
//! `KVSCHED_PROPTEST_CASES` sets more.

use kvsched_capi::*;
use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::config::{ChunkPolicy, Chunking, Config};
use kvsched_core::error::Error;
use kvsched_core::ids::{RequestId, TaskId};
use kvsched_core::kv::Tier;
use kvsched_core::output::{Listed, SchedulerOutput};
use kvsched_core::page_pool::{KvPool, KvPoolConfig};
use kvsched_core::request::RequestSpec;
use kvsched_core::scheduler::{Scheduler, TransferEnd};
use kvsched_core::storage::{Boxed, Owned};
use kvsched_core::Phase;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config as PtConfig, TestCaseError, TestRunner};

const N: usize = KVSCHED_MAX_REQUESTS as usize;
const T: usize = KVSCHED_MAX_ADAPTERS as usize;
type Sched = Scheduler<KvPool<'static, Owned>, AdapterPool<T>, N, T, Boxed>;

fn cases() -> u32 {
    std::env::var("KVSCHED_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128)
}

/// One operation of the shared vocabulary; requests named by index into the ids submitted.
#[derive(Debug, Clone)]
enum Op {
    Submit(KvschedRequest, Vec<u64>),
    Schedule,
    TakeMoves,
    Complete,
    Finish(Index),
    Inflight(Index, bool),
    EndSend(Index, bool),
    StartReceive(Index),
    EndReceive(Index, bool),
}

fn config() -> impl Strategy<Value = KvschedConfig> {
    (
        (
            prop_oneof![Just(4u32), Just(8), Just(16)],
            2u32..48,
            prop_oneof![Just(0u32), 1u32..48],
        ),
        (2u32..40, 1u32..12, 1u32..8),
        (
            prop_oneof![Just(0u32), 16u32..400],
            prop_oneof![Just(0u32), 4u32..96],
        ),
        (0u8..2, 0u8..2, 1u32..8, 1u32..16),
    )
        .prop_map(
            |((tpb, gpu, host), (blocks, reqs, batch), (tokens, chunk), (rp, pc, ad, ah))| {
                KvschedConfig {
                    tokens_per_block: tpb,
                    gpu_pages: gpu,
                    host_pages: host,
                    max_blocks_per_request: blocks,
                    max_requests: reqs,
                    max_batch: batch,
                    max_num_tokens: tokens,
                    chunk_unit: chunk,
                    recompute_pause: rp,
                    prefix_cache: pc,
                    adapter_device_pages: ad,
                    adapter_host_pages: ah,
                    kv_events: 0,
                    ..kvsched_config_default()
                }
            },
        )
}

fn submit() -> impl Strategy<Value = Op> {
    (
        (0u64..12, 1u32..160, 0u32..40),
        (
            prop_oneof![4 => Just(1u32), 1 => 0u32..3],
            prop_oneof![3 => Just(0u32), 1 => 1u32..3],
        ),
        (prop::option::weighted(0.3, 0u64..5), 0u64..2, 0u64..40),
        (
            prop_oneof![8 => Just(0u8), 1 => Just(1), 1 => Just(2)],
            0u8..4,
        ),
        prop::collection::vec(0u64..3, 0..6),
    )
        .prop_map(
            |((id, prompt, out), (beam, draft), (lora, salt, arrival), (kind, prio), h)| {
                let r = KvschedRequest {
                    id,
                    lora_task: lora.unwrap_or(0),
                    prompt,
                    max_new_tokens: out,
                    beam,
                    draft,
                    cache_salt: salt,
                    arrival,
                    has_lora: u8::from(lora.is_some()),
                    kind,
                    priority: prio,
                    service_class: prio,
                };
                Op::Submit(r, h)
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => submit(),
        6 => Just(Op::Schedule),
        3 => Just(Op::TakeMoves),
        5 => Just(Op::Complete),
        2 => any::<Index>().prop_map(Op::Finish),
        1 => (any::<Index>(), any::<bool>()).prop_map(|(i, b)| Op::Inflight(i, b)),
        1 => (any::<Index>(), any::<bool>()).prop_map(|(i, b)| Op::EndSend(i, b)),
        1 => any::<Index>().prop_map(Op::StartReceive),
        1 => (any::<Index>(), any::<bool>()).prop_map(|(i, b)| Op::EndReceive(i, b)),
    ]
}

/// Adapters registered first (task, pages), then the operations.
type Case = (KvschedConfig, Vec<(u64, u32)>, Vec<Op>);

fn case() -> impl Strategy<Value = Case> {
    (
        config(),
        prop::collection::btree_map(0u64..5, 1u32..4, 0..4).prop_map(|m| m.into_iter().collect()),
        prop::collection::vec(op(), 1..60),
    )
}

/// The core in process, built from a configuration as the header documents its fields.
struct Twin {
    tokens_per_block: u32,
    sched: Box<Sched>,
    out: Box<SchedulerOutput<N, Boxed>>,
}

impl Twin {
    fn new(c: &KvschedConfig, incremental: bool, adapters: &[(u64, u32)]) -> Result<Self, Error> {
        if c.max_requests == 0 || c.max_requests > KVSCHED_MAX_REQUESTS {
            return Err(Error::Invalid("max_requests"));
        }
        let pool = KvPoolConfig {
            tokens_per_block: c.tokens_per_block,
            gpu_pages: c.gpu_pages,
            host_pages: c.host_pages,
            slots: c.max_requests,
            max_blocks: c.max_blocks_per_request,
        };
        let budget = (c.max_num_tokens > 0).then_some(c.max_num_tokens);
        let cfg = Config {
            max_num_requests: c.max_batch,
            max_num_tokens: budget,
            max_context_length: budget,
            chunking: (c.chunk_unit > 0).then_some(Chunking {
                policy: ChunkPolicy::FirstComeFirstServed,
                unit: c.chunk_unit,
            }),
            recompute_pause: c.recompute_pause != 0,
            ..Config::default()
        };
        cfg.validate()?;
        let peft = AdapterPool::new(c.adapter_device_pages, c.adapter_host_pages)?;
        let kv = if c.prefix_cache != 0 {
            KvPool::owned_with_prefix_cache(pool)?
        } else {
            KvPool::owned(pool)?
        };
        let mut sched = Box::new(Sched::boxed(cfg, kv, peft)?);
        sched.set_incremental(incremental);
        for &(task, pages) in adapters {
            sched.register_adapter(TaskId(task), pages)?;
        }
        Ok(Self {
            tokens_per_block: c.tokens_per_block,
            sched,
            out: Box::new(SchedulerOutput::new_in()?),
        })
    }

    fn handle(&self, id: u64) -> Result<kvsched_core::scheduler::Handle, Error> {
        self.sched.find(RequestId(id)).ok_or(Error::StaleHandle)
    }

    fn submit(&mut self, r: &KvschedRequest, hashes: &[u64]) -> Result<(), Error> {
        // The header: at most one hash a full page of the prompt, more refused as invalid.
        if hashes.len() > (r.prompt / self.tokens_per_block) as usize {
            return Err(Error::Invalid("more block hashes than full pages"));
        }
        let phase = match r.kind {
            2 => Phase::DisaggGenerationInit,
            _ => Phase::ContextInit,
        };
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

    fn schedule(&mut self) -> Result<(), Error> {
        self.sched.schedule(&mut self.out)?;
        self.sched.ensure_batch(&mut self.out).map_err(Error::from)
    }

    fn apply(&mut self, op: &Op, id: u64) -> Result<(), Error> {
        let end = |d: bool| {
            if d {
                TransferEnd::Delivered
            } else {
                TransferEnd::Failed
            }
        };
        match op {
            Op::Submit(r, h) => self.submit(r, h),
            Op::Schedule => self.schedule(),
            Op::TakeMoves => Ok(()),
            Op::Complete => self.sched.complete_step(&self.out),
            Op::Finish(_) => self.sched.remove(self.handle(id)?).map(|_| ()),
            Op::Inflight(_, b) => self.sched.set_inflight(self.handle(id)?, *b),
            Op::EndSend(_, d) => self.sched.end_send(self.handle(id)?, end(*d)).map(|_| ()),
            Op::StartReceive(_) => self.sched.start_receive(self.handle(id)?),
            Op::EndReceive(_, d) => self.sched.end_receive(self.handle(id)?, end(*d)),
        }
    }

    fn entry(&self, x: &Listed, tokens: u32, last: bool) -> KvschedEntry {
        let e = self.sched.get(x.handle()).ok();
        let lora = e.and_then(|e| e.spec().lora);
        KvschedEntry {
            id: e.map_or(u64::MAX, |e| e.spec().id.0),
            lora_task: lora.map_or(0, |t| t.0),
            tokens,
            slot: x.slot(),
            has_lora: u8::from(lora.is_some()),
            last: u8::from(last),
            state_slot: KVSCHED_NO_STATE_SLOT,
        }
    }

    /// The last pass's lists: context, generation, paused, recompute-paused, disagg, resumed; and the
    /// adapter loads.
    fn lists(&self) -> Lists {
        let o = &self.out;
        let mut lists = vec![o
            .context()
            .iter()
            .map(|c| self.entry(&c.listed, c.tokens, c.last))
            .collect()];
        for l in [
            o.generation(),
            o.paused(),
            o.recompute_paused(),
            o.disagg(),
            o.resumed(),
        ] {
            lists.push(l.iter().map(|x| self.entry(x, 0, false)).collect());
        }
        let loads = o.adapter_loads().iter().map(|t| t.id.0).collect();
        (lists, loads)
    }

    fn moves(&mut self) -> Vec<KvschedPageMove> {
        self.sched
            .take_moves()
            .iter()
            .map(|m| KvschedPageMove {
                request: m.request.0,
                src: m.src,
                dst: m.dst,
                from_host: u8::from(m.from == Tier::Host),
            })
            .collect()
    }

    /// Live requests, free GPU pages, and the page table of each id that is live.
    fn state(&self, ids: &[u64]) -> (usize, u32, Vec<(u64, Vec<u32>)>) {
        let tables = ids
            .iter()
            .filter_map(|&id| {
                let h = self.handle(id).ok()?;
                Some((id, self.sched.kv().table(h.index()).to_vec()))
            })
            .collect();
        (self.sched.len(), self.sched.kv().gpu_free(), tables)
    }
}

/// The code the header documents for a core error.
fn code(e: &Error) -> KvschedStatus {
    match e {
        Error::CapacityExhausted { .. } => KvschedStatus::Capacity,
        Error::RequestTooLarge { .. } => KvschedStatus::TooLarge,
        Error::DuplicateId(_) | Error::StaleHandle => KvschedStatus::UnknownRequest,
        Error::Peft(_) => KvschedStatus::Adapter,
        Error::Deadlock { .. } => KvschedStatus::Deadlock,
        Error::StaleOutput => KvschedStatus::StaleOutput,
        _ => KvschedStatus::Invalid,
    }
}

fn status(r: Result<(), Error>) -> KvschedStatus {
    r.map_or_else(|e| code(&e), |()| KvschedStatus::Ok)
}

/// A pass's lists (context, generation, paused, recompute-paused, disagg, resumed) and adapter loads.
type Lists = (Vec<Vec<KvschedEntry>>, Vec<u64>);

/// The engine behind the C ABI, driven through its `extern "C"` functions only.
struct Abi(*mut Engine);

impl Drop for Abi {
    fn drop(&mut self) {
        // SAFETY: from `kvsched_engine_new`, freed once.
        unsafe { kvsched_engine_free(self.0) };
    }
}

/// A C array as a vector (empty for a null pointer).
///
/// # Safety
/// `p` points to `n` values (or is null with `n` 0), valid for the call.
unsafe fn read<V: Copy>(p: *const V, n: usize) -> Vec<V> {
    if n == 0 {
        return Vec::new();
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
}

impl Abi {
    fn new(c: &KvschedConfig, adapters: &[(u64, u32)]) -> Result<Self, KvschedStatus> {
        let mut e = std::ptr::null_mut();
        // SAFETY: a local configuration and out pointer.
        let s = unsafe { kvsched_engine_new(c, &raw mut e) };
        if s != KvschedStatus::Ok {
            return Err(s);
        }
        let abi = Self(e);
        for &(task, pages) in adapters {
            // SAFETY: a live engine.
            let s = unsafe { kvsched_register_adapter(abi.0, task, pages) };
            if s != KvschedStatus::Ok {
                return Err(s);
            }
        }
        Ok(abi)
    }

    /// The operation's status, and with a pass the lists it hands out.
    fn apply(&mut self, op: &Op, id: u64) -> (KvschedStatus, Option<Lists>) {
        let e = self.0;
        // SAFETY: each call is on a live engine, with locals for its outputs; an output's arrays are
        // read at once.
        let s = unsafe {
            match op {
                Op::Submit(r, h) => kvsched_submit(e, r, h.as_ptr(), h.len()),
                Op::Schedule => {
                    let mut o: KvschedOutput = std::mem::zeroed();
                    let s = kvsched_schedule(e, &raw mut o);
                    if s == KvschedStatus::Ok {
                        let lists = vec![
                            read(o.context, o.n_context),
                            read(o.generation, o.n_generation),
                            read(o.paused, o.n_paused),
                            read(o.recompute_paused, o.n_recompute_paused),
                            read(o.disagg, o.n_disagg),
                            read(o.resumed, o.n_resumed),
                        ];
                        return (s, Some((lists, read(o.adapter_loads, o.n_adapter_loads))));
                    }
                    s
                }
                Op::TakeMoves => KvschedStatus::Ok,
                Op::Complete => kvsched_complete_step(e),
                Op::Finish(_) => kvsched_finish(e, id),
                Op::Inflight(_, b) => kvsched_set_inflight(e, id, u8::from(*b)),
                Op::EndSend(_, d) => kvsched_end_send(e, id, u8::from(*d)),
                Op::StartReceive(_) => kvsched_start_receive(e, id),
                Op::EndReceive(_, d) => kvsched_end_receive(e, id, u8::from(*d)),
            }
        };
        (s, None)
    }

    fn moves(&mut self) -> Vec<KvschedPageMove> {
        let (mut p, mut n) = (std::ptr::null(), 0usize);
        // SAFETY: a live engine and locals; the moves read at once.
        unsafe {
            assert_eq!(
                kvsched_take_moves(self.0, &raw mut p, &raw mut n),
                KvschedStatus::Ok
            );
            read(p, n)
        }
    }

    fn state(&self, ids: &[u64]) -> (usize, u32, Vec<(u64, Vec<u32>)>) {
        let tables = ids
            .iter()
            .filter_map(|&id| {
                let (mut p, mut n) = (std::ptr::null(), 0usize);
                // SAFETY: a live engine and locals; the table read at once.
                unsafe {
                    (kvsched_page_table(self.0, id, &raw mut p, &raw mut n) == KvschedStatus::Ok)
                        .then(|| (id, read(p, n)))
                }
            })
            .collect();
        // SAFETY: a live engine.
        unsafe { (kvsched_len(self.0), kvsched_gpu_free(self.0), tables) }
    }
}

/// Runs a case through the C ABI and both twins; `Err` names the first difference.
fn check((c, adapters, ops): &Case) -> Result<usize, String> {
    let abi = Abi::new(c, adapters);
    let twins = [true, false].map(|inc| Twin::new(c, inc, adapters));
    let (mut abi, mut twins) = match (abi, twins) {
        (Ok(a), [Ok(x), Ok(y)]) => (a, [x, y]),
        (Err(s), [Err(x), Err(y)]) if s == code(&x) && s == code(&y) => return Ok(0),
        (a, t) => {
            return Err(format!(
                "building: C {:?}, twins {:?}",
                a.err(),
                t.map(Result::err)
            ))
        }
    };
    let mut ids: Vec<u64> = Vec::new();
    let mut passes = 0;
    for (k, op) in ops.iter().enumerate() {
        let id = match op {
            Op::Finish(i)
            | Op::Inflight(i, _)
            | Op::EndSend(i, _)
            | Op::StartReceive(i)
            | Op::EndReceive(i, _)
                if !ids.is_empty() =>
            {
                ids[i.index(ids.len())]
            }
            _ => 99,
        };
        let s = step(&mut abi, &mut twins, op, id).map_err(|d| format!("op {k} {op:?}, {d}"))?;
        if let (Op::Submit(r, _), KvschedStatus::Ok) = (op, s) {
            if !ids.contains(&r.id) {
                ids.push(r.id);
            }
        }
        passes += usize::from(matches!(op, Op::Schedule) && s == KvschedStatus::Ok);
        let cs = abi.state(&ids);
        for twin in &twins {
            if twin.state(&ids) != cs {
                return Err(format!(
                    "after op {k} {op:?}: (live, gpu free, tables) C {cs:?}, core {:?}",
                    twin.state(&ids)
                ));
            }
        }
    }
    Ok(passes)
}

/// One operation through the C ABI and on both twins: its status (the same everywhere), or the
/// first difference of status, lists or page moves.
fn step(abi: &mut Abi, twins: &mut [Twin; 2], op: &Op, id: u64) -> Result<KvschedStatus, String> {
    let (s, lists) = abi.apply(op, id);
    for (t, twin) in twins.iter_mut().enumerate() {
        let which = ["incremental", "full-pass"][t];
        let st = status(twin.apply(op, id));
        if st != s {
            return Err(format!("{which} twin: status C {s:?}, core {st:?}"));
        }
        if let Some(l) = &lists {
            if *l != twin.lists() {
                return Err(format!(
                    "{which} twin: lists\n C    {l:?}\n core {:?}",
                    twin.lists()
                ));
            }
        }
    }
    if matches!(op, Op::TakeMoves) {
        let m = abi.moves();
        for twin in twins.iter_mut() {
            let tm = twin.moves();
            if m != tm {
                return Err(format!("moves C {m:?}, core {tm:?}"));
            }
        }
    }
    Ok(s)
}

/// A case as JSON, to read or keep.
fn json((c, adapters, ops): &Case) -> String {
    format!("{{\"config\": \"{c:?}\", \"adapters\": {adapters:?}, \"ops\": \"{ops:?}\"}}")
}

#[test]
fn the_c_abi_does_what_the_core_does_in_process() {
    let config = PtConfig {
        cases: cases(),
        failure_persistence: None,
        ..PtConfig::default()
    };
    let passes = std::sync::atomic::AtomicUsize::new(0);
    let result = TestRunner::new(config).run(&case(), |c| {
        let n =
            check(&c).map_err(|d| TestCaseError::fail(format!("{d}\n\nthe case: {}", json(&c))))?;
        passes.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    });
    println!(
        "capi difffuzz: {} cases, {} passes compared",
        cases(),
        passes.into_inner()
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}
