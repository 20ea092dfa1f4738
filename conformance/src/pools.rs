//! The scripted pools of a scenario's KV backend: the target (the format's `kv`), an optional draft pool
//! (`kv.draft`) and the cross pool (`kv.cross`), joined by the core's own [`KvSet`] so that the pairing
//! rules under test are the ones serving engines get; or, with `kv.groups`, the target leading
//! sliding-window groups of scripted pools in the core's own [`PoolGroups`] ([`Grouped`]).

use std::collections::{BTreeMap, BTreeSet};

use kvsched_core::kv::KvBackend;
use kvsched_core::kv_groups::{Attention, PoolGroup, PoolGroups};
use kvsched_core::kv_set::{DraftMode, KvSet};
use serde_json::Value;

use crate::error::{Reason, ScenarioError};
use crate::scenario::{script, GroupIn, KvIn, PairMode, PoolIn};
use crate::scripted::{KvCall, ScriptedKv, Scripts};

/// The backend the runner's scheduler holds.
pub type Backend = KvSet<ScriptedKv, ScriptedKv, ScriptedKv>;

/// The backend of a scenario with `kv.groups`: the target leads, then `G - 1` window groups.
pub type Grouped<const G: usize> = PoolGroups<ScriptedKv, G>;

/// Initial cache overrides of one pool.
#[derive(Debug, Default)]
struct Overrides {
    active: BTreeSet<u64>,
    inactive: BTreeSet<u64>,
    no_cache: BTreeSet<u64>,
}

impl Overrides {
    fn of(p: &PoolIn) -> Self {
        Self {
            active: p.active.iter().copied().collect(),
            inactive: p.inactive.iter().copied().collect(),
            no_cache: p.no_cache.iter().copied().collect(),
        }
    }

    /// `default` unless an override names `id`.
    fn cache(&self, id: u64, default: Option<bool>) -> Option<bool> {
        if self.no_cache.contains(&id) {
            None
        } else if self.inactive.contains(&id) {
            Some(false)
        } else if self.active.contains(&id) {
            Some(true)
        } else {
            default
        }
    }
}

/// The runner's handles on the pools' shared state (clones of what the scheduler holds).
pub struct Pools {
    /// The target pool.
    pub target: ScriptedKv,
    draft: Option<(ScriptedKv, Overrides)>,
    cross: Option<(ScriptedKv, Overrides)>,
    /// The window groups' pools, each with the ids whose reuse it scripts itself.
    windows: Vec<(ScriptedKv, BTreeSet<u64>)>,
}

fn scripts(field: &str, p: &PoolIn) -> Result<Scripts, ScenarioError> {
    let s = |name: &str, v: &Option<Value>| script(&format!("{field}.{name}"), v.as_ref());
    Ok(Scripts {
        prepare: s("prepare_context", &p.prepare_context)?,
        resize: s("resize_context", &p.resize_context)?,
        allocate: s("try_allocate_generation", &p.try_allocate_generation)?,
        disagg: s("prepare_disagg_gen_init", &None)?,
        admit: s("admit_mirror", &p.admit_mirror)?,
    })
}

fn ids(field: &str, m: &BTreeMap<String, impl Sized>) -> Result<Vec<u64>, ScenarioError> {
    m.keys()
        .map(|k| {
            k.parse().map_err(|_| {
                ScenarioError::malformed(
                    field,
                    Reason::Key {
                        key: k.clone(),
                        what: "a request id",
                    },
                )
            })
        })
        .collect()
}

/// What a grouped backend cannot hold beside its groups, refused with the field that asks for it.
fn refuse_beside_groups(kv: &KvIn) -> Result<(), ScenarioError> {
    let refuse =
        |field: &str, what| Err(ScenarioError::malformed(field, Reason::NotWithGroups(what)));
    if kv.draft.is_some() {
        return refuse("kv.draft", "a draft pool");
    }
    if !matches!(kv.cross, None | Some(Value::Bool(false))) {
        return refuse(
            "kv.cross",
            "a cross pool (with kv.groups it is absent or false)",
        );
    }
    if kv.connector == Some(true) {
        return refuse("kv.connector", "a KV connector");
    }
    if kv.sends_in_flight == Some(true) {
        return refuse("kv.sends_in_flight", "a transfer manager's sends");
    }
    Ok(())
}

/// A scripted pool from its object.
fn pool(
    field: &str,
    p: &PoolIn,
    tier_below_gpu: bool,
    can_evict: bool,
) -> Result<ScriptedKv, ScenarioError> {
    let kv = ScriptedKv::new(tier_below_gpu, can_evict, scripts(field, p)?);
    for (id, (_, v)) in ids(&format!("{field}.reuse"), &p.reuse)?
        .into_iter()
        .zip(&p.reuse)
    {
        let claims = match v {
            Value::Array(a) => a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>(),
            v => v.as_u64().map(|n| vec![n]),
        }
        .and_then(|v| v.into_iter().map(|n| u32::try_from(n).ok()).collect())
        .ok_or_else(|| {
            ScenarioError::malformed(
                format!("{field}.reuse"),
                Reason::Expected("a token count or a list of them"),
            )
        })?;
        kv.set_claims(id, claims);
    }
    for (id, (_, &t)) in ids(&format!("{field}.probe"), &p.probe)?
        .into_iter()
        .zip(&p.probe)
    {
        kv.set_probe(id, t);
    }
    Ok(kv)
}

impl Pools {
    /// The pools of `kv` around the `target` pool, and the backend joining them.
    ///
    /// # Errors
    ///
    /// [`ScenarioError::Malformed`] for a pool's script, reuse or probe that does not parse.
    pub fn new(kv: &KvIn, target: ScriptedKv) -> Result<(Self, Backend), ScenarioError> {
        for (id, (_, &t)) in ids("kv.probe", &kv.probe)?.into_iter().zip(&kv.probe) {
            target.set_probe(id, t);
        }
        let limits = target.limits();
        let (below, evict) = (limits.tier_below_gpu, limits.can_evict);
        let draft = match &kv.draft {
            None => None,
            Some(p) => {
                let mode = match p.mode {
                    Some(PairMode::Joint) => DraftMode::Joint,
                    Some(PairMode::Unpaired) => DraftMode::Unpaired,
                    None => {
                        return Err(ScenarioError::malformed(
                            "kv.draft.mode",
                            Reason::Missing("\"joint\" or \"unpaired\""),
                        ))
                    }
                };
                Some((mode, pool("kv.draft", p, below, evict)?, Overrides::of(p)))
            }
        };
        let always = PoolIn::default();
        let cross = match &kv.cross {
            None | Some(Value::Bool(true)) => Some((
                pool("kv.cross", &always, below, evict)?,
                Overrides::default(),
            )),
            Some(Value::Bool(false)) => None,
            Some(v) => {
                let p: PoolIn = serde_json::from_value(v.clone()).map_err(|e| {
                    ScenarioError::malformed("kv.cross", Reason::Json(e.to_string()))
                })?;
                if p.mode.is_some() {
                    return Err(ScenarioError::malformed(
                        "kv.cross.mode",
                        Reason::OnlyDraftPairs,
                    ));
                }
                Some((pool("kv.cross", &p, below, evict)?, Overrides::of(&p)))
            }
        };
        let backend = KvSet::with_pools(
            target.clone(),
            draft.as_ref().map(|(m, d, _)| (*m, d.clone())),
            cross.as_ref().map(|(x, _)| x.clone()),
        );
        let pools = Self {
            target,
            draft: draft.map(|(_, d, o)| (d, o)),
            cross,
            windows: Vec::new(),
        };
        Ok((pools, backend))
    }

    /// The pools of `kv` with `kv.groups` (`windows`, `G - 1` of them) around the `target` pool, of
    /// `tokens_per_block` pages, and the groups joining them.
    ///
    /// # Errors
    ///
    /// [`ScenarioError::Malformed`]: a draft or cross pool, a connector or sends in flight beside the
    /// groups, a group's script, reuse or probe that does not parse, or groups the core refuses.
    pub fn grouped<const G: usize>(
        kv: &KvIn,
        target: ScriptedKv,
        windows: &[GroupIn],
        tokens_per_block: u32,
    ) -> Result<(Self, Grouped<G>), ScenarioError> {
        refuse_beside_groups(kv)?;
        let limits = target.limits();
        let (below, evict) = (limits.tier_below_gpu, limits.can_evict);
        target.set_tokens_per_block(tokens_per_block);
        let mut groups = vec![PoolGroup {
            attention: Attention::Full,
            pool: target.clone(),
        }];
        let mut handles = Vec::new();
        for (i, w) in windows.iter().enumerate() {
            let field = format!("kv.groups[{i}]");
            let p = PoolIn {
                prepare_context: w.prepare_context.clone(),
                resize_context: w.resize_context.clone(),
                try_allocate_generation: w.try_allocate_generation.clone(),
                reuse: w.reuse.clone(),
                probe: w.probe.clone(),
                ..PoolIn::default()
            };
            let pool = pool(&field, &p, below, evict)?;
            pool.set_tokens_per_block(tokens_per_block);
            pool.set_request_slots(target.request_slots());
            for (id, (_, &t)) in ids("kv.probe", &kv.probe)?.into_iter().zip(&kv.probe) {
                if !w.probe.contains_key(&id.to_string()) {
                    pool.set_probe(id, t);
                }
            }
            let own = ids(&format!("{field}.reuse"), &w.reuse)?;
            handles.push((pool.clone(), own.into_iter().collect()));
            groups.push(PoolGroup {
                attention: Attention::Sliding { window: w.window },
                pool,
            });
        }
        let groups: [PoolGroup<ScriptedKv>; G] = groups
            .try_into()
            .unwrap_or_else(|_| panic!("{G} groups: the target and {} windows", G - 1));
        let backend = PoolGroups::new(groups)
            .map_err(|e| ScenarioError::malformed("kv.groups", Reason::Refused(e)))?;
        for (id, (_, &t)) in ids("kv.probe", &kv.probe)?.into_iter().zip(&kv.probe) {
            target.set_probe(id, t);
        }
        let pools = Self {
            target,
            draft: None,
            cross: None,
            windows: handles,
        };
        Ok((pools, backend))
    }

    /// Gives a new request its initial caches: the target's `cache` (and reusable prefix), the draft
    /// pool's the same unless overridden, the cross pool's none unless listed, every window group's
    /// the target's (and its reuse, unless the group scripts its own). A cache from an earlier pass
    /// holds `capacity` tokens.
    pub fn set_caches(&self, id: u64, cache: Option<bool>, reuse: u32, capacity: u32) {
        self.target.set_cache(id, cache, reuse);
        if let Some((d, o)) = &self.draft {
            d.set_cache_only(id, o.cache(id, cache));
        }
        if let Some((x, o)) = &self.cross {
            x.set_cache_only(id, o.cache(id, None));
        }
        for (w, own) in &self.windows {
            if own.contains(&id) {
                w.set_cache_only(id, cache);
            } else {
                w.set_cache(id, cache, reuse);
            }
        }
        if cache.is_some() {
            self.target.set_capacity(id, capacity);
            for (w, _) in &self.windows {
                w.set_capacity(id, capacity);
            }
        }
    }

    /// Changes a request's reusable prefix: the target's, and every window group's that does not
    /// script its own.
    pub fn set_reuse(&self, id: u64, reuse: u32) {
        self.target.set_reuse(id, reuse);
        for (w, own) in &self.windows {
            if !own.contains(&id) {
                w.set_reuse(id, reuse);
            }
        }
    }

    /// Whether the draft pool's mirror of `id` is blocked (no draft pool: ignored).
    pub fn set_mirror_blocked(&self, id: u64, blocked: bool) {
        if let Some((d, _)) = &self.draft {
            d.set_blocked(id, blocked);
        }
    }

    /// Forgets every pool's recorded calls.
    pub fn clear_calls(&self) {
        self.target.clear_calls();
        for (p, _) in self.draft.iter().chain(&self.cross) {
            p.clear_calls();
        }
        for (w, _) in &self.windows {
            w.clear_calls();
        }
    }

    /// Every call the pools beside the target recorded (draft, cross, then each window group's), for
    /// a record ([`crate::record`]).
    pub fn other_calls(&self) -> String {
        let mut all = Vec::new();
        for (name, p) in [("draft", &self.draft), ("cross", &self.cross)] {
            if let Some((p, _)) = p {
                all.push(format!("{name} {:?}", &*p.calls()));
            }
        }
        for (i, (w, _)) in self.windows.iter().enumerate() {
            all.push(format!(
                "groups[{}] {:?} undo {:?}",
                i + 1,
                &*w.calls(),
                &*w.undone()
            ));
        }
        all.join("; ")
    }

    /// The pool a `groups[N].` prefix names: group 0 is the target, group `N` the `N`th window group.
    fn group(&self, n: &str) -> Option<&ScriptedKv> {
        match n.parse::<usize>().ok()? {
            0 => Some(&self.target),
            n => self.windows.get(n - 1).map(|(p, _)| p),
        }
    }

    /// The calls of `method` (`[draft.|cross.|groups[N].]name[.limit|.capacity|.keep_from]`): ids, or
    /// `[id, argument]` pairs for the argument forms; `None` for a method no pool records.
    pub fn recorded(&self, method: &str) -> Option<Vec<Value>> {
        let group = |p: &str| {
            let n = p.strip_prefix("groups[")?.strip_suffix(']')?;
            Some(self.group(n))
        };
        let (pool, rest) = match method.split_once('.') {
            Some(("draft", rest)) => (self.draft.as_ref().map(|(p, _)| p), rest),
            Some(("cross", rest)) => (self.cross.as_ref().map(|(p, _)| p), rest),
            Some((p, rest)) if group(p).is_some() => (group(p).flatten(), rest),
            _ => (Some(&self.target), method),
        };
        let (undo, rest) = match rest.strip_prefix("undo.") {
            Some(rest) => (true, rest),
            None => (false, rest),
        };
        let (name, arg) = match rest.rsplit_once('.') {
            Some((n, a @ ("limit" | "capacity" | "keep_from"))) => (n, Some(a)),
            _ => (rest, None),
        };
        let call = KvCall::from_name(name)?;
        let Some(pool) = pool else {
            return Some(Vec::new());
        };
        let calls = if undo { pool.undone() } else { pool.calls() };
        Some(
            calls
                .iter()
                .filter(|(c, _, _)| *c == call)
                .map(|&(_, id, a)| match arg {
                    None => Value::from(id),
                    Some(_) => {
                        Value::from(vec![Value::from(id), a.map_or(Value::Null, Value::from)])
                    }
                })
                .collect(),
        )
    }
}
