//! The conformance runner: scenario files (docs/conformance-format.md) run against the real scheduling
//! pass with scripted KV and adapter managers.

pub mod pools;
pub mod scenario;
pub mod scripted;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use kvsched_core::config::{
    Admission, CapacityPolicy, ChunkPolicy, Chunking, Config, Window, PRIORITY_CLASSES,
};
use kvsched_core::ids::TaskId;
use kvsched_core::output::{Listed, SchedulerOutput};
use kvsched_core::request::RequestSpec;
use kvsched_core::scheduler::{Adopt, Handle, Scheduler, TransferEnd};
use kvsched_core::storage::Boxed;
use kvsched_core::Phase;
use serde_json::Value;

use scenario::Outcomes;
use scenario::{
    id_list, script, AdmissionIn, Expect, IdList, Outcome, PassIn, RequestIn, Scenario,
};
use scripted::{PeftCall, ScriptedKv, ScriptedPeft, Scripts};

/// Requests one scenario may hold.
pub const MAX_REQUESTS: usize = 1024;
/// Adapter tasks one scenario may name.
pub const MAX_TASKS: usize = 256;

/// The runner's scheduler and output: their arrays on the heap (`Boxed`), so a scenario runs on any
/// caller's stack.
type Sched = Scheduler<pools::Backend, ScriptedPeft, MAX_REQUESTS, MAX_TASKS, Boxed>;
type Out = SchedulerOutput<MAX_REQUESTS, Boxed>;

/// The outcome of a run over files.
#[derive(Debug, Default)]
pub struct Report {
    /// Scenarios that passed.
    pub passed: usize,
    /// Scenarios that failed (including malformed files).
    pub failed: usize,
    /// One line per scenario: `ok NAME` or `FAIL NAME: reason`.
    pub lines: Vec<String>,
}

impl Report {
    /// The closing line.
    pub fn summary(&self) -> String {
        format!("{} passed, {} failed", self.passed, self.failed)
    }
}

/// Scenario files under `paths` (files, or folders searched recursively for `*.json`), sorted.
pub fn collect(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    fn walk(p: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
        if p.is_dir() {
            let rd = std::fs::read_dir(p).map_err(|e| format!("{}: {e}", p.display()))?;
            for entry in rd {
                let entry = entry.map_err(|e| format!("{}: {e}", p.display()))?;
                walk(&entry.path(), out)?;
            }
        } else if p.extension().is_some_and(|e| e == "json") {
            out.push(p.to_path_buf());
        } else if !p.exists() {
            return Err(format!("{}: no such file or folder", p.display()));
        }
        Ok(())
    }
    let mut files = Vec::new();
    for p in paths {
        if p.is_file() && p.extension().is_none_or(|e| e != "json") {
            files.push(p.clone());
            continue;
        }
        walk(p, &mut files)?;
    }
    files.sort();
    Ok(files)
}

/// Runs every scenario file under `paths`.
pub fn run_paths(paths: &[PathBuf]) -> Result<Report, String> {
    let mut report = Report::default();
    for f in collect(paths)? {
        let stem = f
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        match run_file(&f) {
            Ok(name) => {
                report.passed += 1;
                report.lines.push(format!("ok {name}"));
            }
            Err(why) => {
                report.failed += 1;
                report.lines.push(format!("FAIL {stem}: {why}"));
            }
        }
    }
    Ok(report)
}

/// Runs one scenario file; `Ok(name)` when it passed, else what differed (or why the file is malformed,
/// with the file, the field and the reason).
pub fn run_file(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let sc: Scenario =
        serde_json::from_str(&text).map_err(|e| format!("{}: malformed: {e}", path.display()))?;
    // A scenario that panics the scheduler fails alone; the run goes on.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_scenario(&sc)))
        .map_err(|_| format!("{}: the runner panicked", path.display()))?;
    outcome
        .map(|()| sc.name)
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn phase_of(field: &str, name: Option<&str>) -> Result<Phase, String> {
    let n = name.unwrap_or("GENERATION_IN_PROGRESS");
    Phase::from_name(n)
        .ok_or_else(|| format!("malformed: field {field}.state: unknown state {n:?}"))
}

fn admission_of(a: &AdmissionIn) -> Result<Admission, String> {
    match a.policy.as_str() {
        "fcfs" => Ok(Admission::Fcfs),
        "vtc" => Ok(Admission::Vtc {
            input_weight: a.input_weight.unwrap_or(1),
            output_weight: a.output_weight.unwrap_or(2),
        }),
        "deadline" => {
            let given = a.ttft.as_deref().unwrap_or(&[]);
            let last = given.last().copied().unwrap_or(0);
            if given.len() > PRIORITY_CLASSES {
                return Err("malformed: field config.admission.ttft: at most four classes".into());
            }
            let ttft = core::array::from_fn(|i| given.get(i).copied().unwrap_or(last));
            Ok(Admission::Deadline { ttft })
        }
        p => Err(format!(
            "malformed: field config.admission.policy: unknown policy {p:?}"
        )),
    }
}

fn transfer_end(o: Outcome) -> TransferEnd {
    match o {
        Outcome::Delivered => TransferEnd::Delivered,
        Outcome::Failed => TransferEnd::Failed,
    }
}

fn spec_of(field: &str, r: &RequestIn) -> Result<RequestSpec, String> {
    let mut s = RequestSpec::new(r.id, phase_of(field, r.state.as_deref())?, 100);
    s.lora = r.lora_task.map(TaskId);
    apply(field, r, &mut s)?;
    Ok(s)
}

/// The request fields a file gives, over `s`: a new request's defaults, or a live request's spec
/// (`passes[].update`).
fn apply(field: &str, r: &RequestIn, s: &mut RequestSpec) -> Result<(), String> {
    fn set<T>(to: &mut T, v: Option<T>) {
        if let Some(v) = v {
            *to = v;
        }
    }
    if r.state.is_some() {
        s.phase = phase_of(field, r.state.as_deref())?;
    }
    set(&mut s.prompt, r.prompt);
    set(&mut s.position, r.position);
    set(&mut s.beam, r.beam);
    set(&mut s.draft, r.draft_tokens);
    set(&mut s.multimodal, r.multimodal);
    set(&mut s.encoder_len, r.encoder_len);
    set(&mut s.skip_cross, r.skip_cross);
    set(&mut s.encoder_pending, r.encoder_ready.map(|ready| !ready));
    set(&mut s.tenant, r.tenant.map(Some));
    set(&mut s.priority, r.priority);
    set(&mut s.arrival, r.arrival);
    set(&mut s.context_only, r.context_only);
    if let Some(mm) = &r.mm {
        mm_runs(field, mm, s)?;
    }
    if let Some(snaps) = &r.snapshots {
        s.snapshots.clear();
        for &p in snaps {
            s.snapshots.push(p).map_err(|_| {
                format!(
                    "malformed: field {field}.snapshots: more than {} snapshot points",
                    s.snapshots.capacity()
                )
            })?;
        }
    }
    if s.position > s.prompt {
        return Err(format!(
            "malformed: field {field}.position: {} is beyond the prompt ({})",
            s.position, s.prompt
        ));
    }
    if s.beam == 0 {
        return Err(format!("malformed: field {field}.beam: must be at least 1"));
    }
    Ok(())
}

/// The engine's conversion of a request's multimodal data: the bidirectional runs, only when the data
/// says its blocks are bidirectional and carries the positions (the embed-mask cumulative sum).
fn mm_runs(field: &str, mm: &scenario::MmIn, s: &mut RequestSpec) -> Result<(), String> {
    s.mm_runs.clear();
    let (true, Some(runs)) = (mm.bidirectional, &mm.runs) else {
        return Ok(());
    };
    for &[a, b] in runs {
        s.mm_runs.push((a, b)).map_err(|_| {
            format!(
                "malformed: field {field}.mm.runs: more than {} runs",
                s.mm_runs.capacity()
            )
        })?;
    }
    Ok(())
}

/// A block key: an integer, or null for none.
fn block_key(field: &str, v: &Value) -> Result<Option<u64>, String> {
    match v {
        Value::Null => Ok(None),
        v => v.as_u64().map(Some).ok_or_else(|| {
            format!("malformed: field {field}: expected a non-negative integer or null")
        }),
    }
}

fn not_started(s: &RequestSpec) -> bool {
    matches!(s.phase, Phase::EncoderInit | Phase::DisaggGenerationInit)
        || (s.phase == Phase::ContextInit && s.position == 0)
}

/// Why a request could not be added: the file is malformed, or the scheduler refused it (a malformed
/// file too, unless the scenario expects the refusal: its first pass's `expect.error`, for the initial
/// requests).
enum Refusal {
    Malformed(String),
    Refused {
        field: String,
        error: kvsched_core::Error,
    },
}

impl From<String> for Refusal {
    fn from(why: String) -> Self {
        Self::Malformed(why)
    }
}

impl Refusal {
    fn malformed(self) -> String {
        match self {
            Self::Malformed(why) => why,
            Self::Refused { field, error } => format!("malformed: field {field}: {error}"),
        }
    }

    fn expected(&self, want: &str) -> bool {
        matches!(self, Self::Refused { error, .. } if error.to_string().contains(want))
    }
}

struct Run {
    sched: Box<Sched>,
    /// The runner's handles on the scripted managers' state.
    kv: pools::Pools,
    peft: ScriptedPeft,
    inactive: BTreeSet<u64>,
    no_cache: BTreeSet<u64>,
    has_peft: bool,
}

impl Run {
    /// The live request `id`, or a malformed-scenario error naming `field`.
    fn find(&self, field: &str, id: u64) -> Result<Handle, String> {
        self.sched
            .find(kvsched_core::RequestId(id))
            .ok_or_else(|| format!("malformed: {field}: unknown id {id}"))
    }

    fn add(&mut self, field: &str, r: &RequestIn) -> Result<(), Refusal> {
        let spec = spec_of(field, r)?;
        let id = r.id;
        let cache = if self.no_cache.contains(&id) {
            None
        } else if self.inactive.contains(&id) {
            Some(false)
        } else if not_started(&spec) {
            None
        } else {
            Some(true)
        };
        self.kv.set_caches(id, cache, r.reuse.unwrap_or(0));
        self.kv
            .set_mirror_blocked(id, r.mirror_blocked.unwrap_or(false));
        if let Some(v) = &r.first_new_block {
            self.kv
                .target
                .set_first_new_block(id, block_key(&format!("{field}.first_new_block"), v)?);
        }
        let how = match (cache, spec.started()) {
            (Some(true), true) => Adopt::Active,
            (Some(false), true) => Adopt::Suspended,
            _ => Adopt::Waiting,
        };
        let h = self.sched.adopt(spec, how).map_err(|e| Refusal::Refused {
            field: field.to_string(),
            error: e,
        })?;
        if r.pending_load == Some(true) {
            let marked = self.sched.set_pending_load(h, true);
            debug_assert!(marked.is_ok(), "a request just adopted is live");
        }
        Ok(())
    }

    fn clear_calls(&mut self) {
        self.kv.clear_calls();
        self.peft.clear_calls();
    }
}

/// The setting a scenario names in `field`: the default when absent.
fn named<T: Default>(
    field: &str,
    name: Option<&str>,
    from_name: fn(&str) -> Option<T>,
) -> Result<T, String> {
    name.map_or(Ok(T::default()), |n| {
        from_name(n).ok_or_else(|| format!("malformed: field {field}: unknown value {n:?}"))
    })
}

fn config_of(sc: &Scenario) -> Result<Config, String> {
    let c = &sc.config;
    let tokens = c.max_num_tokens.unwrap_or(Some(1024));
    let chunking = match &c.chunking {
        None => None,
        Some(ch) => Some(Chunking {
            policy: named(
                "config.chunking.policy",
                Some(&ch.policy),
                ChunkPolicy::from_name,
            )?,
            unit: ch.unit,
        }),
    };
    let cfg = Config {
        max_num_requests: c
            .scheduler_capacity
            .unwrap_or(c.max_batch_size.unwrap_or(100)),
        max_num_tokens: tokens,
        max_context_length: c.max_context_length.unwrap_or(tokens),
        chunking,
        policy: named(
            "config.policy",
            c.policy.as_deref(),
            CapacityPolicy::from_name,
        )?,
        recompute_pause: c.recompute_pause.unwrap_or(true),
        prefix_aware: c.prefix_aware.unwrap_or(true),
        window: named("config.window", c.window.as_deref(), Window::from_name)?,
        deadlock_threshold: c.deadlock_threshold.unwrap_or(1000),
        blocked_fast_path: c.blocked_fast_path.unwrap_or(true),
        admission: match &c.admission {
            None => Admission::Fcfs,
            Some(a) => admission_of(a)?,
        },
        drain_after: c
            .admission
            .as_ref()
            .and_then(|a| a.drain_after)
            .unwrap_or(256),
    };
    cfg.validate()
        .map_err(|e| format!("malformed: field config: {e}"))?;
    if c.tokens_per_block == Some(0) {
        return Err("malformed: field config.tokens_per_block: must be at least 1".into());
    }
    Ok(cfg)
}

/// Runs a parsed scenario.
pub fn run_scenario(sc: &Scenario) -> Result<(), String> {
    let cfg = config_of(sc)?;
    let kv = &sc.kv;
    let scripts = Scripts {
        prepare: script("kv.prepare_context", kv.prepare_context.as_ref())
            .map_err(|e| format!("malformed: {e}"))?,
        resize: script("kv.resize_context", kv.resize_context.as_ref())
            .map_err(|e| format!("malformed: {e}"))?,
        allocate: script(
            "kv.try_allocate_generation",
            kv.try_allocate_generation.as_ref(),
        )
        .map_err(|e| format!("malformed: {e}"))?,
        disagg: script(
            "kv.prepare_disagg_gen_init",
            kv.prepare_disagg_gen_init.as_ref(),
        )
        .map_err(|e| format!("malformed: {e}"))?,
        admit: Outcomes::Always(true),
    };
    let skv = ScriptedKv::new(
        kv.tier_below_gpu.unwrap_or(true),
        kv.can_evict.unwrap_or(false),
        scripts,
    );
    skv.set_transfers(
        kv.connector.unwrap_or(false),
        kv.sends_in_flight.unwrap_or(false),
    );
    let all_reusable = match kv.reuse_policy.as_deref() {
        None | Some("all_reusable") => true,
        Some("per_request" | "per_conversation") => false,
        Some(v) => {
            return Err(format!(
                "malformed: field kv.reuse_policy: unknown policy {v:?} (all_reusable, per_request, per_conversation)"
            ))
        }
    };
    skv.set_all_reusable(kv.block_reuse.unwrap_or(false) && all_reusable);
    let all_requests: Vec<&RequestIn> = sc
        .requests
        .iter()
        .chain(sc.passes.iter().flatten().flat_map(|p| p.add.iter()))
        .collect();
    let peft = match &sc.peft {
        None => ScriptedPeft::disabled(),
        Some(p) => {
            let mut tasks: Vec<(u64, u32)> = Vec::new();
            for t in all_requests.iter().filter_map(|r| r.lora_task) {
                if !tasks.iter().any(|x| x.0 == t) {
                    let pages = match p.task_pages.get(&t.to_string()) {
                        Some(&n) => n,
                        None => p.pages_per_task,
                    };
                    tasks.push((t, pages));
                }
            }
            for k in p.task_pages.keys() {
                k.parse::<u64>().map_err(|_| {
                    format!("malformed: field peft.task_pages: key {k:?} is not a task id")
                })?;
            }
            if tasks.len() > MAX_TASKS {
                return Err(format!(
                    "malformed: field peft: more than {MAX_TASKS} tasks"
                ));
            }
            ScriptedPeft::new(p.max_device_pages, &tasks)
        }
    };
    match (&sc.expect, &sc.passes) {
        (Some(_), Some(_)) => {
            return Err("malformed: both \"expect\" and \"passes\" are present".into())
        }
        (None, None) => {
            return Err("malformed: one of \"expect\" and \"passes\" is required".into())
        }
        _ => {}
    }
    let mut seen = BTreeSet::new();
    for r in &all_requests {
        if !seen.insert(r.id) {
            return Err(format!("malformed: field requests: duplicate id {}", r.id));
        }
    }
    if sc.requests.len() > MAX_REQUESTS {
        return Err(format!(
            "malformed: field requests: more than {MAX_REQUESTS} requests"
        ));
    }
    let (kv_ctl, backend) = pools::Pools::new(kv, skv)?;
    let peft_ctl = peft.clone();
    let sched =
        Sched::new_in(cfg, backend, peft).map_err(|e| format!("malformed: field config: {e}"))?;
    let mut run = Run {
        sched: Box::new(sched),
        kv: kv_ctl,
        peft: peft_ctl,
        inactive: kv.inactive.iter().copied().collect(),
        no_cache: kv.no_cache.iter().copied().collect(),
        has_peft: sc.peft.is_some(),
    };
    for (i, r) in sc.requests.iter().enumerate() {
        if let Err(refusal) = run.add(&format!("requests[{i}]"), r) {
            // A refusal the scenario expects (the first pass's `expect.error`) is its outcome.
            let expected = match (&sc.expect, &sc.passes) {
                (Some(e), _) => e.error.as_deref(),
                (None, Some(p)) => p.first().and_then(|p| p.expect.error.as_deref()),
                _ => None,
            };
            return match expected {
                Some(want) if refusal.expected(want) => Ok(()),
                _ => Err(refusal.malformed()),
            };
        }
    }
    if let Some(p) = &sc.peft {
        let pinned = run.sched.adapters().pinned_pages();
        if pinned > p.max_device_pages {
            return Err(format!(
                "malformed: field peft.max_device_pages: initial leases need {pinned} pages, the cache has {}",
                p.max_device_pages
            ));
        }
        run.peft.load_leased();
    }

    let single;
    let passes: &[PassIn] = match (&sc.expect, &sc.passes) {
        (Some(e), None) => {
            single = [PassIn {
                remove: vec![],
                end_send: vec![],
                end_receive: vec![],
                update: vec![],
                add: vec![],
                inflight: sc.inflight.clone(),
                sends_in_flight: None,
                expect: e.clone(),
            }];
            &single
        }
        (None, Some(p)) => p,
        _ => unreachable!(),
    };
    let mut out = Out::new_in().map_err(|e| format!("output: {e}"))?;
    for (k, pass) in passes.iter().enumerate() {
        let label = if passes.len() > 1 {
            format!("pass {}: ", k + 1)
        } else {
            String::new()
        };
        if k > 0 {
            // The engine hands the page moves to the copy engine, runs the step and completes it.
            let _ = run.sched.take_moves();
            let _ = run.sched.take_pool_moves(kvsched_core::kv::Pool::Draft);
            let _ = run.sched.take_pool_moves(kvsched_core::kv::Pool::Cross);
            run.sched
                .complete_step(&out)
                .map_err(|e| format!("passes[{k}]: complete_step: {e}"))?;
            let ends = [
                ("end_send", &pass.end_send),
                ("end_receive", &pass.end_receive),
            ];
            for (name, list) in ends {
                for (j, t) in list.iter().enumerate() {
                    let field = format!("passes[{k}].{name}[{j}]");
                    let h = run.find(&field, t.id)?;
                    let how = transfer_end(t.outcome);
                    let ended = match name {
                        "end_send" => run.sched.end_send(h, how).map(|_| ()),
                        _ => run.sched.end_receive(h, how),
                    };
                    ended.map_err(|e| format!("malformed: {field}: {e}"))?;
                }
            }
            for &id in &pass.remove {
                let h = run.find(&format!("passes[{k}].remove"), id)?;
                run.sched
                    .remove(h)
                    .map_err(|e| format!("passes[{k}].remove: {e}"))?;
            }
            for (j, u) in pass.update.iter().enumerate() {
                let field = format!("passes[{k}].update[{j}]");
                let h = run.find(&field, u.id)?;
                if let Some(b) = u.mirror_blocked {
                    run.kv.set_mirror_blocked(u.id, b);
                }
                if let Some(b) = u.pending_load {
                    run.sched
                        .set_pending_load(h, b)
                        .map_err(|e| format!("{field}.pending_load: {e}"))?;
                }
                if let Some(v) = &u.first_new_block {
                    run.kv.target.set_first_new_block(
                        u.id,
                        block_key(&format!("{field}.first_new_block"), v)?,
                    );
                }
                if let Some(r) = u.reuse {
                    run.kv.target.set_reuse(u.id, r);
                }
                if u.lora_task.is_some() {
                    return Err(format!(
                        "malformed: {field}.lora_task: the LoRA task of a request cannot change"
                    ));
                }
                let mut spec = run.sched.get(h).map_err(|e| e.to_string())?.spec().clone();
                apply(&field, u, &mut spec)?;
                run.sched
                    .update(h, |s| *s = spec)
                    .map_err(|e| format!("malformed: {field}: {e}"))?;
            }
            for (j, a) in pass.add.iter().enumerate() {
                run.add(&format!("passes[{k}].add[{j}]"), a)
                    .map_err(Refusal::malformed)?;
            }
        }
        let handles: Vec<_> = run.sched.requests().map(|(h, _)| h).collect();
        for h in handles {
            let _ = run.sched.set_inflight(h, false);
        }
        if let Some(b) = pass.sends_in_flight {
            let connector = kvsched_core::kv::KvBackend::has_connector(&run.kv.target);
            run.kv.target.set_transfers(connector, b);
        }
        let inflight = if k == 0 && pass.inflight.is_empty() {
            &sc.inflight
        } else {
            &pass.inflight
        };
        for &id in inflight {
            let h = run.find("inflight", id)?;
            let _ = run.sched.set_inflight(h, true);
        }
        run.clear_calls();
        let result = run.sched.schedule(&mut out);
        check(&mut run, &out, result, &pass.expect).map_err(|e| format!("{label}{e}"))?;
    }
    Ok(())
}

/// The ids of listed requests (every listed request is live when the pass returns).
fn ids<'a>(sched: &Sched, list: impl Iterator<Item = &'a Listed>) -> Vec<u64> {
    list.map(|l| id_of(sched, *l)).collect()
}

fn id_of(sched: &Sched, l: Listed) -> u64 {
    sched.get(l.handle()).map_or(u64::MAX, |e| e.spec().id.0)
}

fn check(
    run: &mut Run,
    out: &Out,
    result: Result<(), kvsched_core::Error>,
    e: &Expect,
) -> Result<(), String> {
    let mut diffs = String::new();
    match (&result, &e.error) {
        (Err(err), None) => return Err(format!("the pass failed: {err}")),
        (Ok(()), Some(want)) => {
            let _ = write!(
                diffs,
                "error: expected an error containing {want:?}, the pass succeeded; "
            );
        }
        (Err(err), Some(want)) => {
            if !err.to_string().contains(want.as_str()) {
                let _ = write!(diffs, "error: expected {want:?} in {:?}; ", err.to_string());
            }
        }
        (Ok(()), None) => {}
    }
    let s = &*run.sched;
    let lists: [(&str, &Option<Value>, Vec<u64>); 6] = [
        ("generation", &e.generation, ids(s, out.generation().iter())),
        (
            "context",
            &e.context,
            ids(s, out.context().iter().map(|c| &c.listed)),
        ),
        ("encoder", &e.encoder, ids(s, out.encoder().iter())),
        ("paused", &e.paused, ids(s, out.paused().iter())),
        (
            "recompute_paused",
            &e.recompute_paused,
            ids(s, out.recompute_paused().iter()),
        ),
        ("disagg", &e.disagg, ids(s, out.disagg().iter())),
    ];
    for (name, want, got) in lists {
        let Some(want) = want else { continue };
        let want =
            id_list(&format!("expect.{name}"), want).map_err(|e| format!("malformed: {e}"))?;
        let same = match &want {
            IdList::Exact(w) => *w == got,
            IdList::Set(w) => {
                let mut a = w.clone();
                let mut b = got.clone();
                a.sort_unstable();
                b.sort_unstable();
                a == b
            }
        };
        if !same {
            let w = match &want {
                IdList::Exact(w) => format!("{w:?}"),
                IdList::Set(w) => format!("set {w:?}"),
            };
            let _ = write!(diffs, "{name}: expected {w}, got {got:?}; ");
        }
    }
    if let Some(n) = e.num_fitting {
        if out.num_fitting() != n {
            let _ = write!(
                diffs,
                "num_fitting: expected {n}, got {}; ",
                out.num_fitting()
            );
        }
    }
    if let Some(chunks) = &e.chunks {
        for (id, want) in chunks {
            let id: u64 = id
                .parse()
                .map_err(|_| format!("malformed: field expect.chunks: key {id:?} is not an id"))?;
            match out
                .context()
                .iter()
                .find(|c| id_of(&run.sched, c.listed) == id)
            {
                None => {
                    let _ = write!(
                        diffs,
                        "chunks.{id}: expected {want}, request not in context; "
                    );
                }
                Some(c) if c.tokens != *want => {
                    let _ = write!(diffs, "chunks.{id}: expected {want}, got {}; ", c.tokens);
                }
                _ => {}
            }
        }
    }
    if let Some(pos) = &e.positions {
        for (id, want) in pos {
            let idn: u64 = id.parse().map_err(|_| {
                format!("malformed: field expect.positions: key {id:?} is not an id")
            })?;
            let h = run
                .sched
                .find(kvsched_core::RequestId(idn))
                .ok_or_else(|| format!("positions.{id}: unknown request"))?;
            let got = run.sched.get(h).map_err(|e| e.to_string())?.spec().position;
            if got != *want {
                let _ = write!(diffs, "positions.{id}: expected {want}, got {got}; ");
            }
        }
    }
    if let Some(calls) = &e.calls {
        for (method, want) in calls {
            check_calls(run, method, want, &mut diffs)?;
        }
    }
    if let Some(n) = e.stall_count {
        if run.sched.stall_count() != n {
            let _ = write!(
                diffs,
                "stall_count: expected {n}, got {}; ",
                run.sched.stall_count()
            );
        }
    }
    if run.has_peft && result.is_ok() {
        let want = e.ensure_batch.as_deref().unwrap_or("ok");
        let mut o = out.clone();
        match (run.sched.ensure_batch(&mut o), want) {
            (Ok(()), "ok") => {}
            (Ok(()), w) => {
                let _ = write!(
                    diffs,
                    "ensure_batch: expected an error containing {w:?}, it succeeded; "
                );
            }
            (Err(err), "ok") => {
                let _ = write!(diffs, "ensure_batch failed: {err}; ");
            }
            (Err(err), w) => {
                if !err.to_string().contains(w) {
                    let _ = write!(
                        diffs,
                        "ensure_batch: expected {w:?} in {:?}; ",
                        err.to_string()
                    );
                }
            }
        }
    }
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(diffs.trim_end_matches("; ").to_string())
    }
}

fn check_calls(run: &Run, method: &str, want: &Value, diffs: &mut String) -> Result<(), String> {
    let field = format!("expect.calls.{method}");
    // Recorded calls of this method: ids, or (id, flag) pairs.
    let got: Vec<Value> = match run.kv.recorded(method) {
        Some(calls) => calls,
        None if PeftCall::METHODS.contains(&method) => {
            let peft = run.peft.calls();
            peft.iter().filter_map(|c| c.recorded(method)).collect()
        }
        None => return Err(format!("malformed: field {field}: unknown method")),
    };
    match want {
        Value::Array(w) => {
            if *w != got {
                let _ = write!(
                    diffs,
                    "calls.{method}: expected {}, got {}; ",
                    Value::from(w.clone()),
                    Value::from(got)
                );
            }
        }
        Value::Object(m) if m.len() == 1 && m.contains_key("count") => {
            let n = m["count"]
                .as_u64()
                .ok_or_else(|| format!("malformed: field {field}.count: expected an integer"))?;
            if got.len() as u64 != n {
                let _ = write!(
                    diffs,
                    "calls.{method}: expected {n} calls, got {}; ",
                    got.len()
                );
            }
        }
        _ => {
            return Err(format!(
                "malformed: field {field}: expected a list or {{\"count\": n}}"
            ))
        }
    }
    Ok(())
}
