//! The generator of the differential fuzz: scenario files as JSON values (see `difffuzz.rs`).

use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{json, Map, Value};

/// Ids a generated scenario's requests may take (scripts name them too).
const IDS: u64 = 16;

/// What a scenario may hold: its shape, fixed first so that the rest agrees with it.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// Nothing KV groups cannot hold (no draft or cross pool, connector, sends, encoder requests,
    /// GUARANTEED_NO_EVICT).
    groupable: bool,
    /// An adapter cache, and LoRA tasks on requests.
    peft: bool,
}

/// Puts `v` under `k` when it is there.
fn put(m: &mut Map<String, Value>, k: &str, v: Option<Value>) {
    if let Some(v) = v {
        m.insert(k.to_owned(), v);
    }
}

fn maybe<T: Into<Value> + std::fmt::Debug + Clone + 'static>(
    p: f64,
    s: impl Strategy<Value = T> + 'static,
) -> BoxedStrategy<Option<Value>> {
    let s = s.prop_map(Into::into);
    if p <= 0.0 {
        Just(None).boxed()
    } else if p >= 1.0 {
        s.prop_map(Some).boxed()
    } else {
        prop::option::weighted(p, s).boxed()
    }
}

fn okfail() -> impl Strategy<Value = Value> {
    prop_oneof![3 => Just(json!("ok")), 1 => Just(json!("fail"))]
}

/// A script in one of its forms (absent: always ok).
fn script() -> BoxedStrategy<Option<Value>> {
    let calls = (prop::collection::vec(any::<bool>(), 0..8), any::<bool>())
        .prop_map(|(c, then)| json!({"calls": c, "then": then}));
    let per_id = prop_oneof![
        okfail(),
        prop::collection::vec(any::<bool>(), 1..4).prop_map(Value::from)
    ];
    let ids = (
        prop::collection::btree_map(0..IDS, per_id, 0..4),
        prop::collection::btree_map(0..IDS, prop::collection::vec(0..IDS, 1..3), 0..3),
        okfail(),
    )
        .prop_map(|(ids, after, otherwise)| {
            let key = |k: u64| k.to_string();
            let ids: Map<_, _> = ids.into_iter().map(|(k, v)| (key(k), v)).collect();
            let after: Map<_, _> = after
                .into_iter()
                .filter(|(k, _)| !ids.contains_key(&key(*k)))
                .map(|(k, v)| (key(k), Value::from(v)))
                .collect();
            json!({"ids": ids, "after_released": after, "else": otherwise})
        });
    prop_oneof![
        5 => Just(None),
        1 => okfail().prop_map(Some),
        2 => calls.prop_map(Some),
        2 => ids.prop_map(Some),
    ]
    .boxed()
}

fn config(shape: Shape) -> impl Strategy<Value = Value> {
    let chunking = (
        prop_oneof![Just("fcfs"), Just("force_chunk"), Just("equal_progress")],
        prop_oneof![Just(8u32), Just(16), Just(32), Just(64), 1u32..200],
    )
        .prop_map(|(p, unit)| json!({"policy": p, "unit": unit}));
    let budget = prop_oneof![1 => Just(Value::Null), 3 => (8u32..600).prop_map(Value::from)];
    let admission = prop_oneof![
        Just(json!({"policy": "fcfs"})),
        (1u32..4, 1u32..4, 0u32..4).prop_map(|(i, o, d)| json!({"policy": "vtc", "input_weight": i, "output_weight": o, "drain_after": d})),
        prop::collection::vec(0u64..50, 1..5).prop_map(|t| json!({"policy": "deadline", "ttft": t})),
    ];
    let gne = if shape.groupable { 0.0 } else { 0.3 };
    (
        (maybe(0.7, 1u32..8), maybe(0.1, 1u32..8)),
        (maybe(0.6, budget.clone()), maybe(0.3, budget)),
        maybe(0.5, prop_oneof![Just(16u32), Just(32), Just(64)]),
        maybe(0.6, chunking),
        maybe(gne, Just("guaranteed_no_evict")),
        (maybe(0.4, any::<bool>()), maybe(0.3, any::<bool>())),
        maybe(0.2, Just("encoder")),
        maybe(0.4, 1u32..6),
        maybe(0.2, any::<bool>()),
        maybe(0.3, admission),
    )
        .prop_map(
            |((batch, cap), (tokens, ctx), tpb, ch, pol, (rp, pa), win, dl, fast, adm)| {
                let mut m = Map::new();
                put(&mut m, "max_batch_size", batch);
                put(&mut m, "scheduler_capacity", cap);
                put(&mut m, "max_num_tokens", tokens);
                // Without chunking, a limit below the token budget is a configuration the core refuses.
                put(&mut m, "max_context_length", ctx.filter(|_| ch.is_some()));
                put(&mut m, "tokens_per_block", tpb);
                put(&mut m, "chunking", ch);
                put(&mut m, "policy", pol);
                put(&mut m, "recompute_pause", rp);
                put(&mut m, "prefix_aware", pa);
                put(&mut m, "window", win);
                put(&mut m, "deadlock_threshold", dl);
                put(&mut m, "blocked_fast_path", fast);
                put(&mut m, "admission", adm);
                Value::Object(m)
            },
        )
}

/// A draft or cross pool's object.
fn side_pool(draft: bool) -> impl Strategy<Value = Value> {
    let mode = if draft { 1.0 } else { 0.0 };
    (
        maybe(mode, prop_oneof![Just("joint"), Just("unpaired")]),
        (script(), script(), script()),
        maybe(
            if draft { 0.3 } else { 0.0 },
            script().prop_map(|s| s.unwrap_or(json!("ok"))),
        ),
        prop::collection::btree_map(0..IDS, 0u32..200, 0..3),
        prop::collection::vec(0..IDS, 0..3),
    )
        .prop_map(|(mode, (prep, resize, alloc), admit, reuse, inactive)| {
            let mut m = Map::new();
            put(&mut m, "mode", mode);
            put(&mut m, "prepare_context", prep);
            put(&mut m, "resize_context", resize);
            put(&mut m, "try_allocate_generation", alloc);
            put(&mut m, "admit_mirror", admit);
            m.insert("reuse".into(), by_id(reuse));
            m.insert("inactive".into(), inactive.into());
            Value::Object(m)
        })
}

/// A per-request map of the format (`{"id": tokens}`).
fn by_id(m: std::collections::BTreeMap<u64, u32>) -> Value {
    let m: Map<_, _> = m
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.into()))
        .collect();
    m.into()
}

fn kv(shape: Shape) -> impl Strategy<Value = Value> {
    let side = if shape.groupable { 0.0 } else { 0.3 };
    let cross = prop_oneof![Just(json!(true)), Just(json!(false)), side_pool(false)];
    (
        (maybe(0.4, any::<bool>()), maybe(0.4, any::<bool>())),
        (
            prop::collection::vec(0..IDS, 0..3),
            prop::collection::vec(0..IDS, 0..2),
        ),
        (script(), script(), script(), script()),
        (
            maybe(0.4, any::<bool>()),
            maybe(
                0.2,
                prop_oneof![
                    Just("all_reusable"),
                    Just("per_request"),
                    Just("per_conversation")
                ],
            ),
        ),
        prop::collection::btree_map(0..IDS, 0u32..300, 0..3),
        (maybe(side, side_pool(true)), maybe(side, cross)),
        (maybe(side, any::<bool>()), maybe(side, any::<bool>())),
    )
        .prop_map(
            |(
                (tier, evict),
                (inactive, no_cache),
                (p, r, a, d),
                (reuse, policy),
                probe,
                (draft, cross),
                (conn, sends),
            )| {
                let mut m = Map::new();
                put(&mut m, "tier_below_gpu", tier);
                put(&mut m, "can_evict", evict);
                m.insert("inactive".into(), inactive.into());
                m.insert("no_cache".into(), no_cache.into());
                put(&mut m, "prepare_context", p);
                put(&mut m, "resize_context", r);
                put(&mut m, "try_allocate_generation", a);
                put(&mut m, "prepare_disagg_gen_init", d);
                put(&mut m, "block_reuse", reuse);
                put(&mut m, "reuse_policy", policy);
                m.insert("probe".into(), by_id(probe));
                put(&mut m, "draft", draft);
                put(&mut m, "cross", cross);
                put(&mut m, "connector", conn);
                put(&mut m, "sends_in_flight", sends);
                Value::Object(m)
            },
        )
}

/// A request's starting phase and position (a fraction of its prompt, for a context request).
fn phase(shape: Shape) -> impl Strategy<Value = (&'static str, u32)> {
    let encoder = u32::from(!shape.groupable);
    prop_oneof![
        4 => (Just("CONTEXT_INIT"), prop_oneof![3 => Just(0u32), 1 => 1u32..100]),
        4 => Just(("GENERATION_IN_PROGRESS", 0)),
        1 => Just(("DISAGG_GENERATION_INIT", 0)),
        encoder => Just(("ENCODER_INIT", 0)),
        1 => prop_oneof![
            Just(("GENERATION_TO_COMPLETE", 0)),
            Just(("GENERATION_COMPLETE", 0)),
            Just(("DISAGG_GENERATION_TRANS_IN_PROGRESS", 0)),
        ],
    ]
}

/// Snapshot points in order, once each.
fn sorted(s: Value) -> Value {
    let mut s: Vec<u64> = serde_json::from_value(s).unwrap_or_default();
    s.sort_unstable();
    s.dedup();
    Value::from(s)
}

/// A request without its id.
fn request(shape: Shape) -> impl Strategy<Value = Map<String, Value>> {
    let lora = if shape.peft { 0.6 } else { 0.0 };
    let encoder = if shape.groupable { 0.0 } else { 0.2 };
    (
        (phase(shape), 1u32..400),
        (
            maybe(0.2, 1u32..4),
            maybe(0.3, 0u32..4),
            maybe(0.3, 0u32..300),
        ),
        (maybe(lora, 0u64..4), maybe(0.2, 0u32..3)),
        (maybe(0.2, 0u32..4), maybe(0.2, 0u64..40)),
        (
            maybe(0.1, any::<bool>()),
            maybe(0.1, 0u64..3),
            maybe(0.1, any::<bool>()),
        ),
        (
            maybe(0.1, Just(true)),
            maybe(encoder, 1u32..100),
            maybe(0.1, any::<bool>()),
        ),
        maybe(0.1, prop::collection::vec(1u32..400, 1..3)),
    )
        .prop_map(
            |(
                (state, prompt),
                (beam, draft, reuse),
                (lora, tenant),
                (prio, arrival),
                (mm, fnb, pending),
                (ctx_only, enc, ready),
                snaps,
            )| {
                let (state, frac) = state;
                let mut m = Map::new();
                m.insert("state".into(), state.into());
                m.insert("prompt".into(), prompt.into());
                if frac > 0 {
                    m.insert("position".into(), (prompt * frac / 100).into());
                }
                put(&mut m, "beam", beam);
                put(&mut m, "draft_tokens", draft);
                put(&mut m, "reuse", reuse);
                put(&mut m, "lora_task", lora);
                put(&mut m, "tenant", tenant);
                put(&mut m, "priority", prio);
                put(&mut m, "arrival", arrival);
                put(&mut m, "multimodal", mm);
                put(&mut m, "first_new_block", fnb);
                put(&mut m, "pending_load", pending);
                if state == "CONTEXT_INIT" {
                    put(&mut m, "context_only", ctx_only);
                    put(&mut m, "encoder_ready", ready);
                }
                put(&mut m, "encoder_len", enc);
                put(&mut m, "snapshots", snaps.map(sorted));
                m
            },
        )
}

/// A live request's fields a pass may overwrite (those the format lets `update` change without
/// changing what the request is).
fn update() -> impl Strategy<Value = Map<String, Value>> {
    (
        (
            maybe(0.3, 1u32..4),
            maybe(0.3, 0u32..4),
            maybe(0.2, 0u32..300),
        ),
        (maybe(0.2, 0u32..4), maybe(0.2, 0u64..40)),
        (
            maybe(0.2, any::<bool>()),
            maybe(0.2, 0u64..3),
            maybe(0.1, any::<bool>()),
        ),
    )
        .prop_map(
            |((beam, draft, reuse), (prio, arrival), (pending, fnb, blocked))| {
                let mut m = Map::new();
                put(&mut m, "beam", beam);
                put(&mut m, "draft_tokens", draft);
                put(&mut m, "reuse", reuse);
                put(&mut m, "priority", prio);
                put(&mut m, "arrival", arrival);
                put(&mut m, "pending_load", pending);
                put(&mut m, "first_new_block", fnb);
                put(&mut m, "mirror_blocked", blocked);
                m
            },
        )
}

/// One pass's operations, its requests named by index into the live ones.
#[derive(Debug, Clone)]
struct PassOps {
    remove: Vec<Index>,
    update: Vec<(Index, Map<String, Value>)>,
    add: Vec<Map<String, Value>>,
    inflight: Vec<Index>,
    /// A transfer's end (true: a send, else a receive), delivered or failed.
    end: Option<(bool, Index, bool)>,
    sends_in_flight: Option<bool>,
}

fn pass_ops(shape: Shape) -> impl Strategy<Value = PassOps> {
    let sends = if shape.groupable { 0.0 } else { 0.1 };
    (
        prop::collection::vec(any::<Index>(), 0..2),
        prop::collection::vec((any::<Index>(), update()), 0..2),
        prop::collection::vec(request(shape), 0..3),
        prop::collection::vec(any::<Index>(), 0..2),
        prop::option::weighted(0.05, (any::<bool>(), any::<Index>(), any::<bool>())),
        maybe(sends, any::<bool>()).prop_map(|b| b.and_then(|b| b.as_bool())),
    )
        .prop_map(
            |(remove, update, add, inflight, end, sends_in_flight)| PassOps {
                remove,
                update,
                add,
                inflight,
                end,
                sends_in_flight,
            },
        )
}

/// A generated scenario before its ids are given.
#[derive(Debug, Clone)]
pub struct Gen {
    config: Value,
    kv: Value,
    peft: Option<Value>,
    requests: Vec<Map<String, Value>>,
    passes: Vec<PassOps>,
}

pub fn scenario() -> impl Strategy<Value = Gen> {
    (prop::bool::weighted(0.6), prop::bool::weighted(0.3))
        .prop_flat_map(|(groupable, peft)| {
            let shape = Shape { groupable, peft };
            let peft = (1u32..8, 1u32..3)
                .prop_map(|(d, p)| json!({"max_device_pages": d, "pages_per_task": p}));
            (
                config(shape),
                kv(shape),
                maybe(if shape.peft { 1.0 } else { 0.0 }, peft),
                prop::collection::vec(request(shape), 0..6),
                prop::collection::vec(pass_ops(shape), 1..7),
            )
        })
        .prop_map(|(config, kv, peft, requests, passes)| Gen {
            config,
            kv,
            peft,
            requests,
            passes,
        })
}

/// The ids of a scenario being written: every request so far (by id), the live ones, and the last
/// pass's in-flight marks.
#[derive(Default)]
struct Ids {
    all: Vec<Value>,
    live: Vec<u64>,
    inflight: Vec<u64>,
}

/// The `i`th of `ids` (none when there are none).
fn pick(ids: &[u64], i: &Index) -> Option<u64> {
    (!ids.is_empty()).then(|| ids[i.index(ids.len())])
}

impl Ids {
    /// `r` with the next id, now live.
    fn arrive(&mut self, r: &Map<String, Value>) -> Value {
        let id = self.all.len() as u64;
        let mut r = r.clone();
        r.insert("id".into(), id.into());
        self.all.push(Value::Object(r));
        self.live.push(id);
        self.all[id as usize].clone()
    }

    /// Removals, of requests not in flight (the last pass's marks stand until this pass's are set).
    fn remove(&mut self, ops: &PassOps) -> Vec<u64> {
        let free: Vec<u64> = self
            .live
            .iter()
            .copied()
            .filter(|x| !self.inflight.contains(x))
            .collect();
        let mut remove = Vec::new();
        for i in &ops.remove {
            if let Some(id) = pick(&free, i).filter(|id| !remove.contains(id)) {
                self.live.retain(|&x| x != id);
                remove.push(id);
            }
        }
        remove
    }

    /// A transfer's end: `(field, [{id, outcome}])`, mostly of a request that may be sending
    /// (context-only) or receiving (a disaggregated generation request).
    fn end(&mut self, (send, i, delivered): (bool, &Index, bool)) -> Option<(&'static str, Value)> {
        let may = |id: &u64| {
            let r = &self.all[*id as usize];
            if send {
                r["context_only"] == json!(true)
            } else {
                r["state"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("DISAGG_GENERATION"))
            }
        };
        let likely: Vec<u64> = self.live.iter().copied().filter(may).collect();
        let id = pick(
            if likely.is_empty() {
                &self.live
            } else {
                &likely
            },
            i,
        )?;
        if send {
            self.live.retain(|&x| x != id);
        }
        let outcome = if delivered { "delivered" } else { "failed" };
        let field = if send { "end_send" } else { "end_receive" };
        Some((field, json!([{"id": id, "outcome": outcome}])))
    }

    /// One pass's object (the first has no operations: the runner applies them between passes).
    fn pass(&mut self, first: bool, ops: &PassOps) -> Value {
        let mut p = Map::new();
        if !first {
            let remove = self.remove(ops);
            if let Some((field, v)) = ops.end.as_ref().and_then(|(s, i, d)| self.end((*s, i, *d))) {
                p.insert(field.into(), v);
            }
            let update: Vec<Value> = ops
                .update
                .iter()
                .filter_map(|(i, u)| {
                    let mut u = u.clone();
                    u.insert("id".into(), pick(&self.live, i)?.into());
                    Some(Value::Object(u))
                })
                .collect();
            let add: Vec<Value> = ops.add.iter().map(|r| self.arrive(r)).collect();
            p.insert("remove".into(), remove.into());
            p.insert("update".into(), update.into());
            p.insert("add".into(), add.into());
            put(
                &mut p,
                "sends_in_flight",
                ops.sends_in_flight.map(Value::from),
            );
        }
        self.inflight = ops
            .inflight
            .iter()
            .filter_map(|i| pick(&self.live, i))
            .collect();
        self.inflight.dedup();
        p.insert("inflight".into(), self.inflight.clone().into());
        Value::Object(p)
    }
}

impl Gen {
    /// The scenario file: ids given in order of arrival, each pass's operations on the requests
    /// still live.
    pub fn to_json(&self) -> Value {
        let mut ids = Ids::default();
        let requests: Vec<Value> = self.requests.iter().map(|r| ids.arrive(r)).collect();
        let passes: Vec<Value> = self
            .passes
            .iter()
            .enumerate()
            .map(|(k, ops)| ids.pass(k == 0, ops))
            .collect();
        let mut sc = json!({
            "name": "DF",
            "about": "generated by conformance/tests/difffuzz.rs",
            "config": self.config,
            "kv": self.kv,
            "requests": requests,
            "passes": passes,
        });
        if let Some(p) = &self.peft {
            sc["peft"] = p.clone();
        }
        sc
    }
}
