//! # kvsched-conformance
//!
//! The conformance runner: scenario files (docs/conformance-format.md) run against the real scheduling
//! pass with scripted KV and adapter managers ([`scripted`], joined by [`pools`]). The format is a
//! contract: files written to it keep running. A file that is malformed, or a scenario that does not pass,
//! is a typed error ([`FileError`], [`ScenarioError`]) naming the file, the scenario and the field.
#![deny(missing_docs)]

pub mod error;
pub mod grouped;
pub mod hybrid;
mod passes;
pub mod pools;
pub mod record;
pub mod scenario;
pub mod scripted;

use kvsched_core::step_budget::{StepBudget, StepCost};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use kvsched_core::config::{
    Admission, CapacityPolicy, Chunking, Config, Share, Window, PRIORITY_CLASSES, SERVICE_CLASSES,
};
use kvsched_core::ids::TaskId;
use kvsched_core::kv::KvBackend;
use kvsched_core::output::{Listed, SchedulerOutput};
use kvsched_core::request::RequestSpec;
use kvsched_core::scheduler::{Adopt, Handle, Scheduler, TransferEnd};
use kvsched_core::storage::Boxed;
use kvsched_core::Phase;
use serde_json::Value;

pub use error::{CollectError, FileError, Reason, ScenarioError, Shape};
use scenario::{
    id_list, script, AdmissionIn, AdmissionPolicy, Expect, GroupIn, IdList, Named, Outcome,
    Outcomes, PassIn, PeftIn, RequestIn, ReusePolicy, Scenario, ShareIn,
};
use scripted::{PeftCall, ScriptedKv, ScriptedPeft, Scripts};

/// Requests one scenario may hold.
pub const MAX_REQUESTS: usize = 1024;
/// Adapter tasks one scenario may name.
pub const MAX_TASKS: usize = 256;

/// The runner's scheduler and output: their arrays on the heap (`Boxed`), so a scenario runs on any
/// caller's stack.
type Sched<K> = Scheduler<K, ScriptedPeft, MAX_REQUESTS, MAX_TASKS, Boxed>;
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
    /// Passes of the passed scenarios that were incremental, each equal to the full pass.
    pub incremental: u64,
}

impl Report {
    /// The closing line.
    pub fn summary(&self) -> String {
        format!(
            "{} passed, {} failed ({} incremental passes, each equal to the full pass)",
            self.passed, self.failed, self.incremental
        )
    }
}

/// Scenario files under `paths` (files, or folders searched recursively for `*.json`), sorted.
///
/// # Errors
///
/// [`CollectError`] for a path that does not exist, a folder that cannot be listed, or paths that hold
/// no scenario file at all.
pub fn collect(paths: &[PathBuf]) -> Result<Vec<PathBuf>, CollectError> {
    fn walk(p: &Path, out: &mut Vec<PathBuf>) -> Result<(), CollectError> {
        let io = |source| CollectError::Io {
            path: p.to_path_buf(),
            source,
        };
        if p.is_dir() {
            for entry in std::fs::read_dir(p).map_err(io)? {
                walk(&entry.map_err(io)?.path(), out)?;
            }
        } else if p.extension().is_some_and(|e| e == "json") {
            out.push(p.to_path_buf());
        } else if !p.exists() {
            return Err(CollectError::Missing(p.to_path_buf()));
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
    if files.is_empty() {
        return Err(CollectError::Empty(paths.to_vec()));
    }
    files.sort();
    Ok(files)
}

/// Runs every scenario file under `paths`.
///
/// # Errors
///
/// [`CollectError`] when a path names no scenarios; a scenario that fails is a `FAIL` line of the report.
pub fn run_paths(paths: &[PathBuf]) -> Result<Report, CollectError> {
    let mut report = Report::default();
    for f in collect(paths)? {
        let stem = f
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        match run_file_counted(&f) {
            Ok((name, incremental)) => {
                report.passed += 1;
                report.incremental += incremental;
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

/// Runs one scenario file; `Ok(name)` when it passed.
///
/// # Errors
///
/// [`FileError`]: the file could not be read or parsed (with the field at fault), or the scenario did
/// not pass (what differed, or why it is malformed, with the field).
pub fn run_file(path: &Path) -> Result<String, FileError> {
    run_file_counted(path).map(|(name, _)| name)
}

/// [`run_file`], with the scenario's incremental passes.
fn run_file_counted(path: &Path) -> Result<(String, u64), FileError> {
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let sc = parse(&text).map_err(|(field, message)| FileError::Parse {
        path: path.to_path_buf(),
        name: serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| Some(v.get("name")?.as_str()?.to_owned())),
        field,
        message,
    })?;
    let name = sc.name.clone();
    // A scenario that panics the scheduler fails alone; the run goes on. The scheduler keeps its arrays
    // on the heap (`Boxed`), so any caller's stack will do.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_counted(&sc)))
        .map_err(|_| FileError::Panicked {
            path: path.to_path_buf(),
        })?;
    match outcome {
        Ok(incremental) => Ok((name, incremental)),
        Err(source) => Err(FileError::Scenario {
            path: path.to_path_buf(),
            name,
            source,
        }),
    }
}

/// Parses a scenario document; on error, the field's path (`None`: the document) and serde's message.
fn parse(text: &str) -> Result<Scenario, (Option<String>, String)> {
    let mut de = serde_json::Deserializer::from_str(text);
    let sc: Scenario = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        // The document as a whole is `.`, an unknown place `?`.
        let field = e.path().to_string();
        let field = (field != "." && field != "?").then_some(field);
        (field, e.into_inner().to_string())
    })?;
    de.end().map_err(|e| (None, e.to_string()))?;
    Ok(sc)
}

fn phase_of(state: Option<Named<Phase>>) -> Phase {
    state.map_or(Phase::GenerationInProgress, |n| n.0)
}

fn admission_of(a: &AdmissionIn) -> Result<Admission, ScenarioError> {
    match a.policy {
        AdmissionPolicy::Fcfs => Ok(Admission::Fcfs),
        AdmissionPolicy::Priority => Ok(Admission::Priority),
        AdmissionPolicy::Vtc => Ok(Admission::Vtc {
            input_weight: a.input_weight.unwrap_or(1),
            output_weight: a.output_weight.unwrap_or(2),
        }),
        AdmissionPolicy::Deadline => {
            let given = a.ttft.as_deref().unwrap_or(&[]);
            let last = given.last().copied().unwrap_or(0);
            if given.len() > PRIORITY_CLASSES {
                return Err(ScenarioError::malformed(
                    "config.admission.ttft",
                    Reason::TooMany {
                        what: "classes",
                        max: PRIORITY_CLASSES,
                    },
                ));
            }
            let ttft = core::array::from_fn(|i| given.get(i).copied().unwrap_or(last));
            Ok(Admission::Deadline { ttft })
        }
    }
}

/// `config.shares`: class 0 first, missing classes none.
fn shares_of(given: &[ShareIn]) -> Result<[Share; SERVICE_CLASSES], ScenarioError> {
    if given.len() > SERVICE_CLASSES {
        return Err(ScenarioError::malformed(
            "config.shares",
            Reason::TooMany {
                what: "classes",
                max: SERVICE_CLASSES,
            },
        ));
    }
    Ok(core::array::from_fn(|i| {
        given.get(i).map_or(Share::default(), |g| Share {
            requests: g.requests,
            kv_tokens: g.kv_tokens,
            adapter_pages: g.adapter_pages,
        })
    }))
}

fn transfer_end(o: Outcome) -> TransferEnd {
    match o {
        Outcome::Delivered => TransferEnd::Delivered,
        Outcome::Failed => TransferEnd::Failed,
    }
}

fn spec_of(field: &str, r: &RequestIn) -> Result<RequestSpec, ScenarioError> {
    let mut s = RequestSpec::new(r.id, phase_of(r.state), 100);
    s.lora = r.lora_task.map(TaskId);
    apply(field, r, &mut s)?;
    Ok(s)
}

/// The request fields a file gives, over `s`: a new request's defaults, or a live request's spec
/// (`passes[].update`).
fn apply(field: &str, r: &RequestIn, s: &mut RequestSpec) -> Result<(), ScenarioError> {
    fn set<T>(to: &mut T, v: Option<T>) {
        if let Some(v) = v {
            *to = v;
        }
    }
    if let Some(state) = r.state {
        s.phase = state.0;
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
    set(&mut s.class, r.class);
    set(&mut s.arrival, r.arrival);
    set(&mut s.context_only, r.context_only);
    if let Some(mm) = &r.mm {
        mm_runs(field, mm, s)?;
    }
    if let Some(snaps) = &r.snapshots {
        s.snapshots.clear();
        for &p in snaps {
            s.snapshots.push(p).map_err(|_| {
                ScenarioError::malformed(
                    format!("{field}.snapshots"),
                    Reason::TooMany {
                        what: "snapshot points",
                        max: s.snapshots.capacity(),
                    },
                )
            })?;
        }
    }
    if s.position > s.prompt {
        return Err(ScenarioError::malformed(
            format!("{field}.position"),
            Reason::BeyondPrompt {
                position: s.position,
                prompt: s.prompt,
            },
        ));
    }
    if s.beam == 0 {
        return Err(ScenarioError::malformed(
            format!("{field}.beam"),
            Reason::Zero,
        ));
    }
    Ok(())
}

/// The engine's conversion of a request's multimodal data: the bidirectional runs, only when the data
/// says its blocks are bidirectional and carries the positions (the embed-mask cumulative sum).
fn mm_runs(field: &str, mm: &scenario::MmIn, s: &mut RequestSpec) -> Result<(), ScenarioError> {
    s.mm_runs.clear();
    let (true, Some(runs)) = (mm.bidirectional, &mm.runs) else {
        return Ok(());
    };
    for &[a, b] in runs {
        s.mm_runs.push((a, b)).map_err(|_| {
            ScenarioError::malformed(
                format!("{field}.mm.runs"),
                Reason::TooMany {
                    what: "runs",
                    max: s.mm_runs.capacity(),
                },
            )
        })?;
    }
    Ok(())
}

/// A block key: an integer, or null for none.
fn block_key(field: &str, v: &Value) -> Result<Option<u64>, ScenarioError> {
    match v {
        Value::Null => Ok(None),
        v => v.as_u64().map(Some).ok_or_else(|| {
            ScenarioError::malformed(field, Reason::Expected("a non-negative integer or null"))
        }),
    }
}

/// An object key that must be an id (`what`: `a request id`, `a task id`).
fn key_id(field: &str, key: &str, what: &'static str) -> Result<u64, ScenarioError> {
    key.parse().map_err(|_| {
        ScenarioError::malformed(
            field,
            Reason::Key {
                key: key.to_owned(),
                what,
            },
        )
    })
}

fn not_started(s: &RequestSpec) -> bool {
    matches!(s.phase, Phase::EncoderInit | Phase::DisaggGenerationInit)
        || (s.phase == Phase::ContextInit && s.position == 0)
}

/// Why a request could not be added: the file is malformed, or the scheduler refused it (a malformed
/// file too, unless the scenario expects the refusal: its first pass's `expect.error`, for the initial
/// requests).
enum Refusal {
    Malformed(ScenarioError),
    Refused {
        field: String,
        error: kvsched_core::Error,
    },
}

impl From<ScenarioError> for Refusal {
    fn from(why: ScenarioError) -> Self {
        Self::Malformed(why)
    }
}

impl Refusal {
    fn malformed(self) -> ScenarioError {
        match self {
            Self::Malformed(why) => why,
            Self::Refused { field, error } => {
                ScenarioError::malformed(field, Reason::Refused(error))
            }
        }
    }

    fn expected(&self, want: &str) -> bool {
        matches!(self, Self::Refused { error, .. } if error.to_string().contains(want))
    }
}

struct Run<K: KvBackend> {
    sched: Box<Sched<K>>,
    /// The runner's handles on the scripted managers' state.
    kv: pools::Pools,
    peft: ScriptedPeft,
    inactive: BTreeSet<u64>,
    no_cache: BTreeSet<u64>,
    has_peft: bool,
    /// With a state group (`kv.state`): how the state group is drained and read after each pass.
    state: Option<hybrid::Observe<K>>,
}

impl<K: KvBackend> Run<K> {
    /// The live request `id`, or a malformed-scenario error naming `field`.
    fn find(&self, field: &str, id: u64) -> Result<Handle, ScenarioError> {
        self.sched
            .find(kvsched_core::RequestId(id))
            .ok_or_else(|| ScenarioError::malformed(field, Reason::UnknownId(id)))
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
        // A cache from an earlier pass holds the context computed (a generation request's prompt).
        let held = if spec.phase == Phase::ContextInit {
            spec.position
        } else {
            spec.prompt
        };
        self.kv.set_caches(id, cache, r.reuse.unwrap_or(0), held);
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

    /// The spec of the live request `h`.
    fn spec(&self, field: &str, h: Handle) -> Result<RequestSpec, ScenarioError> {
        let e = self.sched.get(h).map_err(|error| ScenarioError::Step {
            field: field.to_owned(),
            error,
        })?;
        Ok(e.spec().clone())
    }
}

fn config_of(sc: &Scenario) -> Result<Config, ScenarioError> {
    let c = &sc.config;
    let tokens = c.max_num_tokens.unwrap_or(Some(1024));
    let cfg = Config {
        max_num_requests: c
            .scheduler_capacity
            .unwrap_or(c.max_batch_size.unwrap_or(100)),
        max_num_tokens: tokens,
        max_context_length: c.max_context_length.unwrap_or(tokens),
        chunking: c.chunking.as_ref().map(|ch| Chunking {
            policy: ch.policy.0,
            unit: ch.unit,
        }),
        policy: c.policy.map_or(CapacityPolicy::default(), |p| p.0),
        recompute_pause: c.recompute_pause.unwrap_or(true),
        prefix_aware: c.prefix_aware.unwrap_or(true),
        window: c.window.map_or(Window::default(), |w| w.0),
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
        thrash_guard: c.thrash_guard.unwrap_or(false),
        shares: c.shares.as_deref().map(shares_of).transpose()?,
        step_budget: c.step_budget.as_ref().map(|b| StepBudget {
            itl_us: b.itl_us,
            cost: StepCost {
                step_ps: b.step_ps,
                prefill_token_ps: b.prefill_token_ps,
                decode_request_ps: b.decode_request_ps,
                cached_token_ps: b.cached_token_ps,
                pair_ps: b.pair_ps,
            },
        }),
    };
    if c.tokens_per_block == Some(0) {
        return Err(ScenarioError::malformed(
            "config.tokens_per_block",
            Reason::Zero,
        ));
    }
    Ok(cfg)
}

/// The error the scenario's first pass expects: a refusal of its configuration or of an initial
/// request is the scenario's outcome when it matches.
fn expected_error(sc: &Scenario) -> Option<&str> {
    match (&sc.expect, &sc.passes) {
        (Some(e), _) => e.error.as_deref(),
        (None, Some(p)) => p.first().and_then(|p| p.expect.error.as_deref()),
        _ => None,
    }
}

/// Runs a parsed scenario.
///
/// # Errors
///
/// [`ScenarioError`]: why the scenario is malformed, which step the scheduler refused, or what its
/// passes' outputs got wrong.
pub fn run_scenario(sc: &Scenario) -> Result<(), ScenarioError> {
    run_counted(sc).map(|_| ())
}

/// [`run_scenario`], differentially: the scenario runs with the incremental pass and again with full
/// passes only, and every pass of the two must do the same (its output lists, every request's state,
/// every call on the scripted backends: [`Run::trace`]). Returns how many passes were incremental.
fn run_counted(sc: &Scenario) -> Result<u64, ScenarioError> {
    let groups = sc.kv.groups.as_deref();
    let (incremental, replayed) = run_with(sc, groups, true, false)?;
    let (full, _) = run_with(sc, groups, false, false)?;
    if let Some(k) =
        (0..incremental.len().max(full.len())).find(|&k| incremental.get(k) != full.get(k))
    {
        return Err(ScenarioError::Differential {
            pass: k + 1,
            incremental: incremental.get(k).cloned().unwrap_or_default(),
            full: full.get(k).cloned().unwrap_or_default(),
        });
    }
    Ok(replayed)
}

/// Runs a parsed scenario on the plain set of pools, or on `groups` (the file's `kv.groups`, or the
/// grouped suite's), with the incremental pass on or off; returns what each pass did
/// ([`Run::trace`]) and how many passes were incremental. `record`: the expectations are not checked
/// ([`record::record`]), and no window group (`groups` empty, the file naming none) is the target alone
/// as a group of one.
fn run_with(
    sc: &Scenario,
    groups: Option<&[GroupIn]>,
    incremental: bool,
    record: bool,
) -> Result<(Vec<String>, u64), ScenarioError> {
    let cfg = config_of(sc)?;
    check_shape(sc)?;
    if let Err(e) = cfg.validate() {
        // A refusal the scenario expects (the first pass's `expect.error`) is its outcome.
        return match expected_error(sc) {
            Some(want) if e.to_string().contains(want) => Ok((vec!["refused config".into()], 0)),
            _ => Err(ScenarioError::malformed("config", Reason::Refused(e))),
        };
    }
    if let Some(st) = &sc.kv.state {
        return hybrid::run(sc, st, cfg, incremental, record);
    }
    let target = target_pool(&sc.kv)?;
    let Some(windows) = groups else {
        let (ctl, backend) = pools::Pools::new(&sc.kv, target)?;
        return run_on(sc, Run::new(sc, cfg, ctl, backend)?, incremental, record);
    };
    grouped::check_passes(sc)?;
    let tpb = sc.config.tokens_per_block.unwrap_or(64);
    match windows.len() {
        0 if record && sc.kv.groups.is_none() => {
            let (ctl, backend) = pools::Pools::grouped::<1>(&sc.kv, target, windows, tpb)?;
            run_on(sc, Run::new(sc, cfg, ctl, backend)?, incremental, record)
        }
        1 => {
            let (ctl, backend) = pools::Pools::grouped::<2>(&sc.kv, target, windows, tpb)?;
            run_on(sc, Run::new(sc, cfg, ctl, backend)?, incremental, record)
        }
        2 => {
            let (ctl, backend) = pools::Pools::grouped::<3>(&sc.kv, target, windows, tpb)?;
            run_on(sc, Run::new(sc, cfg, ctl, backend)?, incremental, record)
        }
        0 => Err(ScenarioError::malformed(
            "kv.groups",
            Reason::Expected("one or two window groups"),
        )),
        _ => Err(ScenarioError::malformed(
            "kv.groups",
            Reason::TooMany {
                what: "window groups",
                max: grouped::MAX_WINDOWS,
            },
        )),
    }
}

/// The scenario's requests and passes on `run`'s scheduler; `record`: each pass's expectations
/// unchecked, and a step the scheduler or the runner refuses ends the trace with its reason.
fn run_on<K: KvBackend>(
    sc: &Scenario,
    mut run: Run<K>,
    incremental: bool,
    record: bool,
) -> Result<(Vec<String>, u64), ScenarioError> {
    run.sched.set_incremental(incremental);
    if let Some(refused) = run.add_initial(sc)? {
        return Ok((vec![refused], 0));
    }
    let single;
    let passes: &[PassIn] = match (&sc.expect, &sc.passes) {
        (Some(e), None) => {
            single = [PassIn::single(sc, e)];
            &single
        }
        (None, Some(p)) => p,
        _ => unreachable!("check_shape: one of the two"),
    };
    let mut out =
        Out::new_in().map_err(|e| ScenarioError::malformed("config", Reason::Refused(e)))?;
    let mut trace = Vec::with_capacity(passes.len());
    for k in 0..passes.len() {
        match run.pass(sc, &mut out, (k, passes), record) {
            Ok(line) => trace.push(line),
            Err(why) if record => {
                trace.push(format!("stopped: {why}"));
                break;
            }
            Err(why) => return Err(why),
        }
    }
    Ok((trace, run.sched.replayed_passes()))
}

/// `expect` or `passes`, not both; the requests' ids unique, and not too many.
fn check_shape(sc: &Scenario) -> Result<(), ScenarioError> {
    match (&sc.expect, &sc.passes) {
        (Some(_), Some(_)) => return Err(ScenarioError::Shape(Shape::Both)),
        (None, None) => return Err(ScenarioError::Shape(Shape::Neither)),
        _ => {}
    }
    let mut seen = BTreeSet::new();
    for r in all_requests(sc) {
        if !seen.insert(r.id) {
            return Err(ScenarioError::malformed(
                "requests",
                Reason::DuplicateId(r.id),
            ));
        }
    }
    if sc.requests.len() > MAX_REQUESTS {
        return Err(ScenarioError::malformed(
            "requests",
            Reason::TooMany {
                what: "requests",
                max: MAX_REQUESTS,
            },
        ));
    }
    Ok(())
}

/// Every request a scenario adds: the initial ones, then each pass's.
fn all_requests(sc: &Scenario) -> impl Iterator<Item = &RequestIn> {
    sc.requests
        .iter()
        .chain(sc.passes.iter().flatten().flat_map(|p| p.add.iter()))
}

/// The target pool the format's `kv` scripts.
fn target_pool(kv: &scenario::KvIn) -> Result<ScriptedKv, ScenarioError> {
    let scripts = Scripts {
        prepare: script("kv.prepare_context", kv.prepare_context.as_ref())?,
        resize: script("kv.resize_context", kv.resize_context.as_ref())?,
        allocate: script(
            "kv.try_allocate_generation",
            kv.try_allocate_generation.as_ref(),
        )?,
        disagg: script(
            "kv.prepare_disagg_gen_init",
            kv.prepare_disagg_gen_init.as_ref(),
        )?,
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
    let all_reusable = matches!(kv.reuse_policy, None | Some(ReusePolicy::AllReusable));
    skv.set_all_reusable(kv.block_reuse.unwrap_or(false) && all_reusable);
    Ok(skv)
}

/// The scripted adapter cache: disabled without `peft`, else every task the requests name with its pages.
fn peft_of(sc: &Scenario) -> Result<ScriptedPeft, ScenarioError> {
    let Some(p) = &sc.peft else {
        return Ok(ScriptedPeft::disabled());
    };
    let mut tasks: Vec<(u64, u32)> = Vec::new();
    for t in all_requests(sc).filter_map(|r| r.lora_task) {
        if !tasks.iter().any(|x| x.0 == t) {
            tasks.push((t, task_pages(p, t)));
        }
    }
    for k in p.task_pages.keys() {
        key_id("peft.task_pages", k, "a task id")?;
    }
    if tasks.len() > MAX_TASKS {
        return Err(ScenarioError::malformed(
            "peft",
            Reason::TooMany {
                what: "tasks",
                max: MAX_TASKS,
            },
        ));
    }
    Ok(ScriptedPeft::new(p.max_device_pages, &tasks))
}

/// The pages of task `t`: its override, else every task's.
fn task_pages(p: &PeftIn, t: u64) -> u32 {
    p.task_pages
        .get(&t.to_string())
        .copied()
        .unwrap_or(p.pages_per_task)
}

impl PassIn {
    /// The one pass of a scenario with a top-level `expect`.
    fn single(sc: &Scenario, e: &Expect) -> Self {
        Self {
            remove: vec![],
            end_send: vec![],
            end_receive: vec![],
            update: vec![],
            add: vec![],
            inflight: sc.inflight.clone(),
            sends_in_flight: None,
            expect: e.clone(),
        }
    }
}

/// Which pass is checked: its index, and how its expectations are named in errors.
struct Pass {
    /// 1-based, for a scenario of several passes.
    number: Option<usize>,
    /// The expectations' field (`expect`, `passes[2].expect`).
    expect: String,
}

impl Pass {
    fn new(k: usize, passes: usize) -> Self {
        if passes > 1 {
            Self {
                number: Some(k + 1),
                expect: format!("passes[{k}].expect"),
            }
        } else {
            Self {
                number: None,
                expect: "expect".into(),
            }
        }
    }
}

impl<K: KvBackend> Run<K> {
    /// The scheduler over the scenario's scripted pools (`backend`, with the runner's handles
    /// `kv_ctl`) and adapter cache, before any request.
    fn new(
        sc: &Scenario,
        cfg: Config,
        kv_ctl: pools::Pools,
        backend: K,
    ) -> Result<Self, ScenarioError> {
        let kv = &sc.kv;
        let peft = peft_of(sc)?;
        let peft_ctl = peft.clone();
        let sched = Sched::new_in(cfg, backend, peft)
            .map_err(|e| ScenarioError::malformed("config", Reason::Refused(e)))?;
        Ok(Self {
            sched: Box::new(sched),
            kv: kv_ctl,
            peft: peft_ctl,
            inactive: kv.inactive.iter().copied().collect(),
            no_cache: kv.no_cache.iter().copied().collect(),
            has_peft: sc.peft.is_some(),
            state: None,
        })
    }

    /// What the engine does between pass `k - 1` and pass `k`: hands the page moves to the copy engine,
    /// runs and completes the step, then applies the pass's transfer ends, removals, updates and additions.
    fn between_passes(&mut self, out: &Out, k: usize, pass: &PassIn) -> Result<(), ScenarioError> {
        let _ = self.sched.take_moves();
        let _ = self.sched.take_pool_moves(kvsched_core::kv::Pool::Draft);
        let _ = self.sched.take_pool_moves(kvsched_core::kv::Pool::Cross);
        self.sched
            .complete_step(out)
            .map_err(|error| ScenarioError::Step {
                field: format!("passes[{k}].complete_step"),
                error,
            })?;
        self.end_transfers(k, pass)?;
        for &id in &pass.remove {
            let field = format!("passes[{k}].remove");
            let h = self.find(&field, id)?;
            self.sched
                .remove(h)
                .map_err(|error| ScenarioError::Step { field, error })?;
        }
        for (j, u) in pass.update.iter().enumerate() {
            self.update(&format!("passes[{k}].update[{j}]"), u)?;
        }
        for (j, a) in pass.add.iter().enumerate() {
            let field = format!("passes[{k}].add[{j}]");
            self.add(&field, a).map_err(Refusal::malformed)?;
            self.leases_fit(&field)?;
        }
        Ok(())
    }

    /// The sends and receives pass `k` says ended.
    fn end_transfers(&mut self, k: usize, pass: &PassIn) -> Result<(), ScenarioError> {
        let ends = [
            ("end_send", &pass.end_send),
            ("end_receive", &pass.end_receive),
        ];
        for (name, list) in ends {
            for (j, t) in list.iter().enumerate() {
                let field = format!("passes[{k}].{name}[{j}]");
                let h = self.find(&field, t.id)?;
                let how = transfer_end(t.outcome);
                let ended = match name {
                    "end_send" => self.sched.end_send(h, how).map(|_| ()),
                    _ => self.sched.end_receive(h, how),
                };
                ended.map_err(|e| ScenarioError::malformed(field, Reason::Refused(e)))?;
            }
        }
        Ok(())
    }

    /// A live request's fields overwritten (`passes[].update[]`), and its scripted state.
    fn update(&mut self, field: &str, u: &RequestIn) -> Result<(), ScenarioError> {
        let h = self.find(field, u.id)?;
        if let Some(b) = u.mirror_blocked {
            self.kv.set_mirror_blocked(u.id, b);
        }
        if let Some(b) = u.pending_load {
            self.sched
                .set_pending_load(h, b)
                .map_err(|error| ScenarioError::Step {
                    field: format!("{field}.pending_load"),
                    error,
                })?;
        }
        if let Some(v) = &u.first_new_block {
            let key = block_key(&format!("{field}.first_new_block"), v)?;
            self.kv.target.set_first_new_block(u.id, key);
        }
        if let Some(r) = u.reuse {
            self.kv.set_reuse(u.id, r);
        }
        if u.lora_task.is_some() {
            return Err(ScenarioError::malformed(
                format!("{field}.lora_task"),
                Reason::LoraChanged,
            ));
        }
        let mut spec = self.spec(field, h)?;
        apply(field, u, &mut spec)?;
        self.sched
            .update(h, |s| *s = spec)
            .map_err(|e| ScenarioError::malformed(field, Reason::Refused(e)))
    }

    /// The pass's in-flight marks and transfer state; the recorded calls forgotten.
    fn prepare_pass(&mut self, pass: &PassIn, inflight: &[u64]) -> Result<(), ScenarioError> {
        let handles: Vec<_> = self.sched.requests().map(|(h, _)| h).collect();
        for h in handles {
            let _ = self.sched.set_inflight(h, false);
        }
        if let Some(b) = pass.sends_in_flight {
            let connector = self.kv.target.connector_attached();
            self.kv.target.set_transfers(connector, b);
        }
        for &id in inflight {
            let h = self.find("inflight", id)?;
            let _ = self.sched.set_inflight(h, true);
        }
        self.clear_calls();
        Ok(())
    }
}

/// The ids of listed requests (every listed request is live when the pass returns).
fn ids<'a, K: KvBackend>(sched: &Sched<K>, list: impl Iterator<Item = &'a Listed>) -> Vec<u64> {
    list.map(|l| id_of(sched, *l)).collect()
}

fn id_of<K: KvBackend>(sched: &Sched<K>, l: Listed) -> u64 {
    sched.get(l.handle()).map_or(u64::MAX, |e| e.spec().id.0)
}

impl<K: KvBackend> Run<K> {
    /// The pass's outcome against its expectations: `Mismatch` with every difference, `PassFailed` for an
    /// unexpected error, `Malformed` for an expectation that does not parse.
    fn check(
        &mut self,
        out: &Out,
        result: Result<(), kvsched_core::Error>,
        e: &Expect,
        at: &Pass,
    ) -> Result<(), ScenarioError> {
        let mut diffs = Vec::new();
        match (&result, &e.error) {
            (Err(error), None) => {
                return Err(ScenarioError::PassFailed {
                    pass: at.number,
                    error: *error,
                })
            }
            (Ok(()), Some(want)) => diffs.push(format!(
                "error: expected an error containing {want:?}, the pass succeeded"
            )),
            (Err(err), Some(want)) if !err.to_string().contains(want.as_str()) => {
                diffs.push(format!("error: expected {want:?} in {:?}", err.to_string()));
            }
            _ => {}
        }
        self.check_lists(out, e, at, &mut diffs)?;
        if let Some(n) = e.num_fitting {
            if out.num_fitting() != n {
                diffs.push(format!(
                    "num_fitting: expected {n}, got {}",
                    out.num_fitting()
                ));
            }
        }
        self.check_chunks(out, e, at, &mut diffs)?;
        self.check_positions(e, at, &mut diffs)?;
        for (method, want) in e.calls.iter().flatten() {
            self.check_calls(method, want, at, &mut diffs)?;
        }
        if let Some(n) = e.stall_count {
            if self.sched.stall_count() != n {
                let got = self.sched.stall_count();
                diffs.push(format!("stall_count: expected {n}, got {got}"));
            }
        }
        if self.has_peft && result.is_ok() {
            self.check_ensure_batch(out, e, &mut diffs);
        }
        if diffs.is_empty() {
            Ok(())
        } else {
            Err(ScenarioError::Mismatch {
                pass: at.number,
                diffs,
            })
        }
    }

    /// The output's lists against the expected ids (exact order, or as a set).
    fn check_lists(
        &self,
        out: &Out,
        e: &Expect,
        at: &Pass,
        diffs: &mut Vec<String>,
    ) -> Result<(), ScenarioError> {
        let s = &*self.sched;
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
            let want = id_list(&format!("{}.{name}", at.expect), want)?;
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
                diffs.push(format!("{name}: expected {w}, got {got:?}"));
            }
        }
        Ok(())
    }

    /// The context chunks' sizes, by id.
    fn check_chunks(
        &self,
        out: &Out,
        e: &Expect,
        at: &Pass,
        diffs: &mut Vec<String>,
    ) -> Result<(), ScenarioError> {
        for (id, want) in e.chunks.iter().flatten() {
            let id = key_id(&format!("{}.chunks", at.expect), id, "an id")?;
            let chunk = out
                .context()
                .iter()
                .find(|c| id_of(&self.sched, c.listed) == id);
            match chunk {
                None => diffs.push(format!(
                    "chunks.{id}: expected {want}, request not in context"
                )),
                Some(c) if c.tokens != *want => {
                    diffs.push(format!("chunks.{id}: expected {want}, got {}", c.tokens));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The requests' positions after the pass, by id.
    fn check_positions(
        &self,
        e: &Expect,
        at: &Pass,
        diffs: &mut Vec<String>,
    ) -> Result<(), ScenarioError> {
        for (id, want) in e.positions.iter().flatten() {
            let field = format!("{}.positions", at.expect);
            let idn = key_id(&field, id, "an id")?;
            let Some(h) = self.sched.find(kvsched_core::RequestId(idn)) else {
                diffs.push(format!("positions.{id}: unknown request"));
                continue;
            };
            let got = self.spec(&field, h)?.position;
            if got != *want {
                diffs.push(format!("positions.{id}: expected {want}, got {got}"));
            }
        }
        Ok(())
    }

    /// The recorded calls of `method` against the expected ones (a list, or `{"count": n}`).
    fn check_calls(
        &self,
        method: &str,
        want: &Value,
        at: &Pass,
        diffs: &mut Vec<String>,
    ) -> Result<(), ScenarioError> {
        let field = format!("{}.calls.{method}", at.expect);
        // Recorded calls of this method: ids, or (id, flag) pairs.
        let got: Vec<Value> = match self.kv.recorded(method) {
            Some(calls) => calls,
            None if PeftCall::METHODS.contains(&method) => {
                let peft = self.peft.calls();
                peft.iter().filter_map(|c| c.recorded(method)).collect()
            }
            None => return Err(ScenarioError::malformed(field, Reason::UnknownMethod)),
        };
        match want {
            Value::Array(w) => {
                if *w != got {
                    diffs.push(format!(
                        "calls.{method}: expected {}, got {}",
                        Value::from(w.clone()),
                        Value::from(got)
                    ));
                }
            }
            Value::Object(m) if m.len() == 1 && m.contains_key("count") => {
                let n = m["count"].as_u64().ok_or_else(|| {
                    ScenarioError::malformed(
                        format!("{field}.count"),
                        Reason::Expected("an integer"),
                    )
                })?;
                if got.len() as u64 != n {
                    diffs.push(format!(
                        "calls.{method}: expected {n} calls, got {}",
                        got.len()
                    ));
                }
            }
            _ => {
                return Err(ScenarioError::malformed(
                    field,
                    Reason::Expected("a list or {\"count\": n}"),
                ))
            }
        }
        Ok(())
    }

    /// The batch's adapters made resident on a copy of the output: `ok`, or the error text expected.
    fn check_ensure_batch(&mut self, out: &Out, e: &Expect, diffs: &mut Vec<String>) {
        let want = e.ensure_batch.as_deref().unwrap_or("ok");
        let mut o = out.clone();
        match (self.sched.ensure_batch(&mut o), want) {
            (Ok(()), "ok") => {}
            (Ok(()), w) => diffs.push(format!(
                "ensure_batch: expected an error containing {w:?}, it succeeded"
            )),
            (Err(err), "ok") => diffs.push(format!("ensure_batch failed: {err}")),
            (Err(err), w) => {
                if !err.to_string().contains(w) {
                    diffs.push(format!(
                        "ensure_batch: expected {w:?} in {:?}",
                        err.to_string()
                    ));
                }
            }
        }
    }
}
