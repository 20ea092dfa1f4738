//! The scenario file format (docs/conformance-format.md): parsing with typed, located errors.
//!
//! The enum-valued fields are deserialised by serde: the runner's own choices as `#[derive(Deserialize)]`
//! enums spelled as the format spells them, the core's settings and phases through their own names
//! ([`Named`]). The scripts and the expected lists take several shapes and are read from their JSON
//! values ([`script`], [`id_list`]), each error naming its field.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use kvsched_core::config::{CapacityPolicy, ChunkPolicy, Window};
use kvsched_core::Phase;
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use serde_json::Value;

use crate::error::{Reason, ScenarioError};

/// A core type the format names by its own spelling (`GENERATION_IN_PROGRESS`, `max_utilization`).
pub trait ByName: Copy + 'static {
    /// What it is, in an error (`state`, `policy`).
    const WHAT: &'static str;
    /// Every value.
    fn all() -> &'static [Self];
    /// The value's name in the format.
    fn name(self) -> &'static str;
}

impl ByName for Phase {
    const WHAT: &'static str = "state";
    fn all() -> &'static [Self] {
        &Phase::ALL
    }
    fn name(self) -> &'static str {
        Phase::name(self)
    }
}

impl ByName for CapacityPolicy {
    const WHAT: &'static str = "policy";
    fn all() -> &'static [Self] {
        CapacityPolicy::ALL
    }
    fn name(self) -> &'static str {
        CapacityPolicy::name(self)
    }
}

impl ByName for ChunkPolicy {
    const WHAT: &'static str = "chunking policy";
    fn all() -> &'static [Self] {
        ChunkPolicy::ALL
    }
    fn name(self) -> &'static str {
        ChunkPolicy::name(self)
    }
}

impl ByName for Window {
    const WHAT: &'static str = "window";
    fn all() -> &'static [Self] {
        Window::ALL
    }
    fn name(self) -> &'static str {
        Window::name(self)
    }
}

/// A core value deserialised from its name; an unknown name is refused with the names it may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Named<T>(pub T);

impl<'de, T: ByName> Deserialize<'de> for Named<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Name<T>(PhantomData<T>);
        impl<T: ByName> Visitor<'_> for Name<T> {
            type Value = Named<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a {} name", T::WHAT)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Named<T>, E> {
                T::all()
                    .iter()
                    .copied()
                    .find(|t| t.name() == v)
                    .map(Named)
                    .ok_or_else(|| {
                        let names: Vec<_> = T::all().iter().map(|t| t.name()).collect();
                        E::custom(format!(
                            "unknown {} {v:?} (one of {})",
                            T::WHAT,
                            names.join(", ")
                        ))
                    })
            }
        }
        d.deserialize_str(Name(PhantomData))
    }
}

// Absent and `null` differ here (keep the field vs clear it): the double option is the point.
#[allow(clippy::option_option)]
fn double<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// A whole scenario file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Unique id.
    pub name: String,
    /// What it checks.
    #[serde(default)]
    pub about: String,
    /// Scheduler configuration.
    #[serde(default)]
    pub config: ConfigIn,
    /// The scripted KV manager.
    #[serde(default)]
    pub kv: KvIn,
    /// The adapter cache (null = none).
    #[serde(default)]
    pub peft: Option<PeftIn>,
    /// Active requests, in order.
    pub requests: Vec<RequestIn>,
    /// In-flight ids for pass 1.
    #[serde(default)]
    pub inflight: Vec<u64>,
    /// Expectations of a single pass.
    #[serde(default)]
    pub expect: Option<Expect>,
    /// Several passes.
    #[serde(default)]
    pub passes: Option<Vec<PassIn>>,
}

/// `config`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigIn {
    /// Request limit.
    pub max_batch_size: Option<u32>,
    /// Replaces `max_batch_size` when set.
    pub scheduler_capacity: Option<u32>,
    /// Token budget; null = unlimited.
    #[serde(default, deserialize_with = "double")]
    pub max_num_tokens: Option<Option<u32>>,
    /// Longest chunk; null = unlimited; absent = `max_num_tokens`.
    #[serde(default, deserialize_with = "double")]
    pub max_context_length: Option<Option<u32>>,
    /// Page size.
    pub tokens_per_block: Option<u32>,
    /// Chunking.
    pub chunking: Option<ChunkIn>,
    /// Capacity policy.
    pub policy: Option<Named<CapacityPolicy>>,
    /// Recompute pause allowed.
    pub recompute_pause: Option<bool>,
    /// Prefix-aware budget.
    pub prefix_aware: Option<bool>,
    /// Window.
    pub window: Option<Named<Window>>,
    /// Deadlock threshold.
    pub deadlock_threshold: Option<u32>,
    /// The blocked pending-context fast path (spec §1.11).
    pub blocked_fast_path: Option<bool>,
    /// Admission order (beyond the reference): absent = FCFS.
    pub admission: Option<AdmissionIn>,
    /// A step budget in time (beyond the reference).
    pub step_budget: Option<StepBudgetIn>,
    /// The thrash guard (beyond the reference).
    pub thrash_guard: Option<bool>,
    /// Service classes' shares (beyond the reference), class 0 first (up to four; missing classes
    /// have none).
    pub shares: Option<Vec<ShareIn>>,
}

/// `config.shares[]` (beyond the reference): what one service class is promised (absent: 0).
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ShareIn {
    /// Batch slots.
    #[serde(default)]
    pub requests: u32,
    /// KV tokens (the whole lives of the class's requests on the GPU).
    #[serde(default)]
    pub kv_tokens: u32,
    /// Adapter pages.
    #[serde(default)]
    pub adapter_pages: u32,
}

/// `config.step_budget` (beyond the reference): the inter-token-latency target in µs and the cost model's
/// coefficients in picoseconds (absent: 0).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepBudgetIn {
    /// The target, µs.
    pub itl_us: u64,
    /// Fixed cost of a step.
    #[serde(default)]
    pub step_ps: u64,
    /// Per prefill token.
    #[serde(default)]
    pub prefill_token_ps: u64,
    /// Per decode request.
    #[serde(default)]
    pub decode_request_ps: u64,
    /// Per cached token a decode reads.
    #[serde(default)]
    pub cached_token_ps: u64,
    /// Per attention pair of a chunk.
    #[serde(default)]
    pub pair_ps: u64,
}

/// `config.admission` (beyond the reference).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionIn {
    /// The order.
    pub policy: AdmissionPolicy,
    /// VTC: weight of a prompt token (1).
    pub input_weight: Option<u32>,
    /// VTC: weight of a generated token (2).
    pub output_weight: Option<u32>,
    /// Deadline: the TTFT objective of each priority class (up to four; missing classes get the last).
    pub ttft: Option<Vec<u64>>,
    /// Passes a request may be refused its adapter before admissions drain (256; 0: never).
    pub drain_after: Option<u32>,
}

/// `config.admission.policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AdmissionPolicy {
    /// `fcfs`: first come, first served (the reference).
    Fcfs,
    /// `vtc`: virtual token counters per client.
    Vtc,
    /// `deadline`: earliest TTFT deadline first.
    Deadline,
    /// `priority`: by `priority` (the lower first), then arrival; a higher priority makes a lower one
    /// yield.
    Priority,
}

/// `config.chunking`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkIn {
    /// `fcfs`, `force_chunk` or `equal_progress`.
    pub policy: Named<ChunkPolicy>,
    /// Unit in tokens.
    pub unit: u32,
}

/// `kv`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvIn {
    /// A host tier exists.
    pub tier_below_gpu: Option<bool>,
    /// Suspension releases GPU pages.
    pub can_evict: Option<bool>,
    /// Ids whose cache starts suspended.
    #[serde(default)]
    pub inactive: Vec<u64>,
    /// Ids with no cache.
    #[serde(default)]
    pub no_cache: Vec<u64>,
    /// Script.
    pub prepare_context: Option<Value>,
    /// Script.
    pub resize_context: Option<Value>,
    /// Script.
    pub try_allocate_generation: Option<Value>,
    /// Script.
    pub prepare_disagg_gen_init: Option<Value>,
    /// Block reuse (prefix caching) is on.
    pub block_reuse: Option<bool>,
    /// Which blocks are reusable (absent: all).
    pub reuse_policy: Option<ReusePolicy>,
    /// What the target pool's `probe_context_reuse` answers, by id (absent: no probe).
    #[serde(default)]
    pub probe: BTreeMap<String, u32>,
    /// A draft pool (speculative decoding); null or absent: none.
    pub draft: Option<PoolIn>,
    /// The cross pool (encoder-decoder): absent or true = a pool that accepts everything, false = no cross
    /// pool, an object = a scripted one.
    pub cross: Option<Value>,
    /// A KV connector is attached (the deadlock error names the GPU-only remedies).
    pub connector: Option<bool>,
    /// The async transfer manager has sends in flight (from the first pass; `passes[].sends_in_flight`
    /// changes it).
    pub sends_in_flight: Option<bool>,
    /// KV groups: the target leads them as full attention, beside one sliding-window group each
    /// (absent: no groups).
    pub groups: Option<Vec<GroupIn>>,
    /// A hybrid recurrent model's state group beside the attention groups (absent: none).
    pub state: Option<crate::hybrid::StateIn>,
}

/// `kv.groups[]`: a sliding-window group's scripted pool.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupIn {
    /// Positions a query reads (a whole number of `config.tokens_per_block` pages).
    pub window: u32,
    /// Script.
    pub prepare_context: Option<Value>,
    /// Script.
    pub resize_context: Option<Value>,
    /// Script.
    pub try_allocate_generation: Option<Value>,
    /// Reusable tokens a first chunk's claims find, by id (absent: the request's `reuse`).
    #[serde(default)]
    pub reuse: BTreeMap<String, Value>,
    /// What `probe_context_reuse` answers, by id (absent: the target's `kv.probe`).
    #[serde(default)]
    pub probe: BTreeMap<String, u32>,
}

/// `kv.reuse_policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReusePolicy {
    /// `all_reusable`: every block may be reused.
    AllReusable,
    /// `per_request`: a request's blocks are its own.
    PerRequest,
    /// `per_conversation`: a conversation's blocks are its own.
    PerConversation,
}

/// `kv.draft.mode`: how the draft pool pairs with the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PairMode {
    /// `joint`: allocated with the target, step for step.
    Joint,
    /// `unpaired`: a mirror admitted after the target.
    Unpaired,
}

/// `kv.draft`, and `kv.cross` as an object: one more scripted pool.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolIn {
    /// `"joint"` or `"unpaired"` (the draft pool only, which needs it).
    pub mode: Option<PairMode>,
    /// Script.
    pub prepare_context: Option<Value>,
    /// Script (a joint draft pool's `try_allocate_draft_context`).
    pub resize_context: Option<Value>,
    /// Script.
    pub try_allocate_generation: Option<Value>,
    /// Script (an unpaired draft pool).
    pub admit_mirror: Option<Value>,
    /// Reusable tokens a first chunk's claims find, by id: an integer, or a list for successive claims.
    #[serde(default)]
    pub reuse: BTreeMap<String, Value>,
    /// What `probe_context_reuse` answers, by id.
    #[serde(default)]
    pub probe: BTreeMap<String, u32>,
    /// Ids whose cache in this pool starts active (a cross pool has none unless listed).
    #[serde(default)]
    pub active: Vec<u64>,
    /// Ids whose cache in this pool starts suspended.
    #[serde(default)]
    pub inactive: Vec<u64>,
    /// Ids with no cache in this pool.
    #[serde(default)]
    pub no_cache: Vec<u64>,
}

/// `requests[].mm`: a request's multimodal data as the engine hands it over.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MmIn {
    /// `mm_bidirectional_blocks`.
    #[serde(default = "yes")]
    pub bidirectional: bool,
    /// The runs of multimodal positions `[start, end)` (what the embed-mask cumulative sum gives);
    /// absent: no cumulative sum.
    pub runs: Option<Vec<[u32; 2]>>,
}

fn yes() -> bool {
    true
}

/// `peft`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeftIn {
    /// Device pages.
    pub max_device_pages: u32,
    /// Pages per adapter.
    #[serde(default = "one")]
    pub pages_per_task: u32,
    /// Per-task override.
    #[serde(default)]
    pub task_pages: BTreeMap<String, u32>,
}

fn one() -> u32 {
    1
}

/// `requests[]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestIn {
    /// Id.
    pub id: u64,
    /// Upstream state name.
    pub state: Option<Named<Phase>>,
    /// LoRA task.
    pub lora_task: Option<u64>,
    /// Beam width.
    pub beam: Option<u32>,
    /// Draft tokens.
    pub draft_tokens: Option<u32>,
    /// Prompt length.
    pub prompt: Option<u32>,
    /// Context position.
    pub position: Option<u32>,
    /// Reusable tokens found by `prepare_context` for a first chunk.
    pub reuse: Option<u32>,
    /// FORCE_CHUNK snapshots.
    pub snapshots: Option<Vec<u32>>,
    /// Carries multimodal data.
    pub multimodal: Option<bool>,
    /// The key of the first block the request would newly contribute (`probe_first_new_block_key`):
    /// an integer, or null for none.
    pub first_new_block: Option<Value>,
    /// Encoder output length (an encoder request's cost; a decoder context's cross cache size).
    pub encoder_len: Option<u32>,
    /// The decoder skips cross-attention projection.
    pub skip_cross: Option<bool>,
    /// The encoder-output-ready event has fired (false: a decoder context waits on it, invisible).
    pub encoder_ready: Option<bool>,
    /// Multimodal data.
    pub mm: Option<MmIn>,
    /// An unpaired draft pool cannot resume this request's suspended mirror now: its preview says
    /// blocked and `admit_mirror` refuses (spec §1.11).
    pub mirror_blocked: Option<bool>,
    /// Tenant (VTC's client; absent: the LoRA task or the base model).
    pub tenant: Option<u32>,
    /// Priority class (deadline admission).
    pub priority: Option<u8>,
    /// Service class (`config.shares`).
    pub class: Option<u8>,
    /// Arrival time (deadline admission).
    pub arrival: Option<u64>,
    /// A KV connector load into the request's pages is pending.
    pub pending_load: Option<bool>,
    /// Disaggregated serving: a context-only request (it sends its KV when its prompt is computed).
    pub context_only: Option<bool>,
}

/// `passes[].end_send[]`, `passes[].end_receive[]`: a transfer's end.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransferEndIn {
    /// The request.
    pub id: u64,
    /// `"delivered"` (default) or `"failed"`.
    #[serde(default)]
    pub outcome: Outcome,
}

/// How a transfer ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Every page arrived.
    #[default]
    Delivered,
    /// It failed or was cancelled.
    Failed,
}

/// `passes[]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PassIn {
    /// Finished or cancelled ids.
    #[serde(default)]
    pub remove: Vec<u64>,
    /// Context side: sends that ended (the request leaves, its pages are freed).
    #[serde(default)]
    pub end_send: Vec<TransferEndIn>,
    /// Generation side: receives that ended (delivered: it decodes; failed: it replays its prefill).
    #[serde(default)]
    pub end_receive: Vec<TransferEndIn>,
    /// Field overwrites.
    #[serde(default)]
    pub update: Vec<RequestIn>,
    /// New requests.
    #[serde(default)]
    pub add: Vec<RequestIn>,
    /// In-flight ids for this pass.
    #[serde(default)]
    pub inflight: Vec<u64>,
    /// The async transfer manager's sends in flight, from this pass on.
    pub sends_in_flight: Option<bool>,
    /// Expectations.
    #[serde(default)]
    pub expect: Expect,
}

/// `expect`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// Generation list.
    pub generation: Option<Value>,
    /// Context list.
    pub context: Option<Value>,
    /// Encoder list.
    pub encoder: Option<Value>,
    /// Paused list.
    pub paused: Option<Value>,
    /// Recompute-paused list.
    pub recompute_paused: Option<Value>,
    /// Disagg list.
    pub disagg: Option<Value>,
    /// Encoders + contexts + generations.
    pub num_fitting: Option<usize>,
    /// Chunk sizes.
    pub chunks: Option<BTreeMap<String, u32>>,
    /// Positions after the pass.
    pub positions: Option<BTreeMap<String, u32>>,
    /// Backend calls.
    pub calls: Option<BTreeMap<String, Value>>,
    /// The pass fails with this text.
    pub error: Option<String>,
    /// Stall counter after the pass.
    pub stall_count: Option<u32>,
    /// `"ok"` or the ensure-batch error text.
    pub ensure_batch: Option<String>,
    /// The recurrent-state group's moves, captures and placements (with `kv.state`).
    pub state: Option<crate::hybrid::StateExpect>,
}

/// An ids list expectation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdList {
    /// Exact, ordered.
    Exact(Vec<u64>),
    /// Order-free.
    Set(Vec<u64>),
}

/// Parses an ids list expectation.
///
/// # Errors
///
/// [`ScenarioError::Malformed`] naming `field`.
pub fn id_list(field: &str, v: &Value) -> Result<IdList, ScenarioError> {
    let bad = |reason| ScenarioError::malformed(field, reason);
    let ids = |a: &Value| -> Result<Vec<u64>, ScenarioError> {
        a.as_array()
            .ok_or_else(|| bad(Reason::Expected("an array of ids")))?
            .iter()
            .map(|x| {
                x.as_u64().ok_or_else(|| {
                    bad(Reason::Not {
                        value: x.to_string(),
                        what: "a non-negative integer id",
                    })
                })
            })
            .collect()
    };
    match v {
        Value::Array(_) => Ok(IdList::Exact(ids(v)?)),
        Value::Object(m) if m.len() == 1 && m.contains_key("set") => {
            Ok(IdList::Set(ids(&m["set"])?))
        }
        _ => Err(bad(Reason::Expected("an array of ids or {\"set\": [...]}"))),
    }
}

/// One scripted outcome source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcomes {
    /// Always.
    Always(bool),
    /// By call number (from 1), then a default.
    Calls(Vec<bool>, bool),
    /// Per id lists / fixed outcomes, per-id release conditions, else.
    ById {
        /// Per-id outcomes.
        ids: BTreeMap<u64, PerId>,
        /// Per-id: succeed once every listed request has released its GPU pages.
        after_released: BTreeMap<u64, Vec<u64>>,
        /// Other ids.
        otherwise: bool,
    },
}

/// A per-id script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PerId {
    /// Fixed.
    Fixed(bool),
    /// Successive calls (past the end: the last value).
    Seq(Vec<bool>),
}

fn okfail(field: &str, v: &Value) -> Result<bool, ScenarioError> {
    match v.as_str() {
        Some("ok") => Ok(true),
        Some("fail") => Ok(false),
        _ => Err(ScenarioError::malformed(
            field,
            Reason::NotOkFail(v.to_string()),
        )),
    }
}

fn bools(field: &str, v: &Value) -> Result<Vec<bool>, ScenarioError> {
    let bad = |reason| ScenarioError::malformed(field, reason);
    v.as_array()
        .ok_or_else(|| bad(Reason::Expected("an array of booleans")))?
        .iter()
        .map(|b| {
            b.as_bool().ok_or_else(|| {
                bad(Reason::Not {
                    value: b.to_string(),
                    what: "a boolean",
                })
            })
        })
        .collect()
}

fn id_key(field: &str, k: &str) -> Result<u64, ScenarioError> {
    k.parse().map_err(|_| {
        ScenarioError::malformed(
            field,
            Reason::Key {
                key: k.to_owned(),
                what: "a request id",
            },
        )
    })
}

/// Parses a script: absent (always succeeds), `"ok"`, `"fail"`, by call (`{"calls": [...], "then": b}`)
/// or by id (`{"ids": {...}, "after_released": {...}, "else": "ok"}`).
///
/// # Errors
///
/// [`ScenarioError::Malformed`] naming the field at fault under `field`.
pub fn script(field: &str, v: Option<&Value>) -> Result<Outcomes, ScenarioError> {
    let Some(v) = v else {
        return Ok(Outcomes::Always(true));
    };
    if v.is_string() {
        return okfail(field, v).map(Outcomes::Always);
    }
    let m = v.as_object().ok_or_else(|| {
        ScenarioError::malformed(field, Reason::Expected("\"ok\", \"fail\" or an object"))
    })?;
    if let Some(calls) = m.get("calls") {
        return by_call(field, m, calls);
    }
    let mut ids = BTreeMap::new();
    let mut after = BTreeMap::new();
    let mut otherwise = true;
    for (k, val) in m {
        match k.as_str() {
            "ids" => per_id(&format!("{field}.ids"), val, &mut ids)?,
            "after_released" => releases(&format!("{field}.after_released"), val, &mut after)?,
            "else" => otherwise = okfail(&format!("{field}.else"), val)?,
            other => {
                return Err(ScenarioError::malformed(
                    field,
                    Reason::UnknownKey(other.to_owned()),
                ))
            }
        }
    }
    if let Some(&id) = ids.keys().find(|id| after.contains_key(id)) {
        return Err(ScenarioError::malformed(field, Reason::InBoth(id)));
    }
    Ok(Outcomes::ById {
        ids,
        after_released: after,
        otherwise,
    })
}

/// A script by call number: `{"calls": [...], "then": b}`.
fn by_call(
    field: &str,
    m: &serde_json::Map<String, Value>,
    calls: &Value,
) -> Result<Outcomes, ScenarioError> {
    if let Some(k) = m.keys().find(|k| *k != "calls" && *k != "then") {
        return Err(ScenarioError::malformed(
            field,
            Reason::BesideCalls(k.clone()),
        ));
    }
    let then = match m.get("then") {
        None => true,
        Some(b) => b.as_bool().ok_or_else(|| {
            ScenarioError::malformed(format!("{field}.then"), Reason::Expected("a boolean"))
        })?,
    };
    Ok(Outcomes::Calls(
        bools(&format!("{field}.calls"), calls)?,
        then,
    ))
}

/// A script's `ids`: per id, a fixed outcome or a list of successive ones.
fn per_id(field: &str, v: &Value, ids: &mut BTreeMap<u64, PerId>) -> Result<(), ScenarioError> {
    let o = v
        .as_object()
        .ok_or_else(|| ScenarioError::malformed(field, Reason::Expected("an object")))?;
    for (id, s) in o {
        let f = format!("{field}.{id}");
        let per = if s.is_array() {
            let v = bools(&f, s)?;
            if v.is_empty() {
                return Err(ScenarioError::malformed(f, Reason::EmptyOutcomes));
            }
            PerId::Seq(v)
        } else {
            PerId::Fixed(okfail(&f, s)?)
        };
        ids.insert(id_key(&f, id)?, per);
    }
    Ok(())
}

/// A script's `after_released`: per id, the requests whose GPU pages it waits for.
fn releases(
    field: &str,
    v: &Value,
    after: &mut BTreeMap<u64, Vec<u64>>,
) -> Result<(), ScenarioError> {
    let o = v
        .as_object()
        .ok_or_else(|| ScenarioError::malformed(field, Reason::Expected("an object")))?;
    for (id, s) in o {
        let f = format!("{field}.{id}");
        let bad = |reason| ScenarioError::malformed(&f, reason);
        let list = s
            .as_array()
            .ok_or_else(|| bad(Reason::Expected("an array of ids")))?
            .iter()
            .map(|x| {
                x.as_u64().ok_or_else(|| {
                    bad(Reason::Not {
                        value: x.to_string(),
                        what: "an id",
                    })
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        after.insert(id_key(&f, id)?, list);
    }
    Ok(())
}
