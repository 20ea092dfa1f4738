//! `--route kv`: a KV-aware router in the manner of NVIDIA Dynamo's `KvRouter`, fed by each replica's
//! KV events (`kvsched_core::kv_events`, what `kvsched serve --kv-events` publishes).
//!
//! **What it knows.** Per replica:
//!
//! - the blocks its prefix cache holds, in either tier, learnt from the events the replica's pool
//!   logged up to the router's decision (a clear forgets them all);
//! - the requests it was sent and has not finished (the router's own accounting, as Dynamo's
//!   active-sequence tracking): their prompt blocks, shared ones counted once, and their prompt work
//!   not yet done, from routing until the first token.
//!
//! **How it picks** (Dynamo's cost; its default overlap weight is 1.0, `--kv-overlap-weight`; its
//! temperature 0): for every replica,
//!
//! ```text
//! overlap  = the request's leading blocks the replica caches
//! prefill  = active prefill blocks + (prompt − overlap × block) / block
//! decode   = active blocks + the request's blocks not already active there
//! cost     = weight × prefill + decode
//! ```
//!
//! and the cheapest replica takes the request (ties: the fewest requests outstanding, then the
//! lowest index; Dynamo breaks ties at random).
//!
//! **How it keys a prompt.** A block is named as the replica's pool names it: the chain of the trace's
//! page hashes from the request's root ([`kvsched_core::kv::chain`]), the root being the adapter
//! identity the pool keys that adapter's prompts under, learnt from the first request of that adapter
//! the replica admitted. Dynamo hashes the block's tokens and the adapter's name instead; both name the
//! same blocks. A replica that never admitted a request of the adapter caches none of its blocks.
//!
//! Left out: the router sees a replica's events the moment its step ends (Dynamo's event plane adds
//! a little delay), and generated tokens add no blocks (Dynamo's `track_output_blocks` is off by
//! default).

use std::collections::HashMap;

use kvsched_core::kv::{chain, Tier};
use kvsched_core::kv_events::{KvEvent, KvEventKind};

/// Dynamo's default `overlap_score_weight`.
pub const OVERLAP_WEIGHT: f64 = 1.0;

/// What a replica told the router since it last asked ([`KvRouter::heard`]).
#[derive(Debug, Default)]
pub(super) struct News {
    /// The adapters (`None`: the base model) whose first request it admitted, with the root it keys
    /// their prompts under.
    pub roots: Vec<(Option<u32>, u64)>,
    /// Arrivals whose first token it produced (their prompt work is done).
    pub prefilled: Vec<usize>,
    /// Arrivals it finished (or handed to a decode engine).
    pub finished: Vec<usize>,
}

/// A routed request, as the router counted it.
#[derive(Debug)]
struct Routed {
    replica: usize,
    /// Its prompt work still counted (blocks, fractional as Dynamo's).
    prefill: f64,
    /// Its block keys counted among the replica's active blocks, and its blocks without a key.
    keys: Vec<u64>,
    unkeyed: u64,
}

/// One replica, as the router sees it.
#[derive(Debug, Default)]
struct Replica {
    /// Cached blocks by key: a bit per tier holding it (GPU 1, host 2).
    cached: HashMap<u64, u8>,
    roots: HashMap<Option<u32>, u64>,
    /// The outstanding requests' prompt work, in blocks.
    prefill: f64,
    /// The outstanding requests' keyed blocks (how many requests hold each), and their blocks without
    /// a key.
    active: HashMap<u64, u32>,
    unkeyed: u64,
}

/// What a request would cost on a replica, and what counting it there adds.
#[derive(Debug)]
struct Estimate {
    cost: f64,
    /// Its prompt work, in blocks.
    prefill: f64,
    keys: Vec<u64>,
    unkeyed: u64,
}

/// What one arrival is, for the router: its adapter, prompt length and page hashes.
pub(super) struct Ask<'a> {
    pub arrival: usize,
    pub adapter: Option<u32>,
    pub prompt: u32,
    pub hashes: &'a [u64],
}

/// The router ([the module docs](self)).
#[derive(Debug)]
pub(super) struct KvRouter {
    block: u32,
    weight: f64,
    replicas: Vec<Replica>,
    routed: HashMap<usize, Routed>,
    /// Cost evaluations made (one per replica per request).
    pub evaluations: u64,
}

impl KvRouter {
    /// A router over `replicas` engines whose pages hold `block` tokens, prefill blocks weighing
    /// `weight` in the cost.
    pub(super) fn new(replicas: usize, block: u32, weight: f64) -> Self {
        debug_assert!(weight.is_finite() && weight >= 0.0, "the options' check");
        Self {
            block: block.max(1),
            weight,
            replicas: (0..replicas.max(1)).map(|_| Replica::default()).collect(),
            routed: HashMap::new(),
            evaluations: 0,
        }
    }

    /// Takes in what replica `k` logged (`events`) and told (`news`) since it was last heard.
    pub(super) fn heard(&mut self, k: usize, events: &[KvEvent], news: News) {
        let rep = &mut self.replicas[k];
        for e in events {
            rep.apply(e);
        }
        for (adapter, root) in news.roots {
            rep.roots.entry(adapter).or_insert(root);
        }
        for a in news.prefilled {
            if let Some(r) = self.routed.get_mut(&a) {
                self.replicas[r.replica].prefill -= r.prefill;
                r.prefill = 0.0;
            }
        }
        for a in news.finished {
            if let Some(r) = self.routed.remove(&a) {
                self.replicas[r.replica].forget(&r);
            }
        }
    }

    /// The replica for `ask`, given each replica's outstanding requests; counts it there.
    pub(super) fn pick(&mut self, ask: &Ask<'_>, outstanding: &[usize]) -> usize {
        let mut best: Option<(f64, usize, usize, Estimate)> = None;
        for (k, rep) in self.replicas.iter().enumerate() {
            self.evaluations += 1;
            let e = self.estimate(rep, ask);
            let load = outstanding.get(k).copied().unwrap_or(0);
            if best
                .as_ref()
                .is_none_or(|(c, l, _, _)| (e.cost, load) < (*c, *l))
            {
                best = Some((e.cost, load, k, e));
            }
        }
        let Some((_, _, k, e)) = best else { return 0 };
        let rep = &mut self.replicas[k];
        rep.prefill += e.prefill;
        for &key in &e.keys {
            *rep.active.entry(key).or_default() += 1;
        }
        rep.unkeyed += e.unkeyed;
        let r = Routed {
            replica: k,
            prefill: e.prefill,
            keys: e.keys,
            unkeyed: e.unkeyed,
        };
        self.routed.insert(ask.arrival, r);
        k
    }

    /// What `ask` would cost on `rep` ([the module docs](self)).
    fn estimate(&self, rep: &Replica, ask: &Ask<'_>) -> Estimate {
        let block = f64::from(self.block);
        let keys = rep.keys(ask);
        let overlap = keys
            .iter()
            .take_while(|k| rep.cached.contains_key(k))
            .count();
        let prompt = f64::from(ask.prompt);
        let prefill = (prompt - overlap as f64 * block).max(0.0) / block;
        let unkeyed = u64::from(ask.prompt.div_ceil(self.block)) - keys.len() as u64;
        let fresh = keys.iter().filter(|k| !rep.active.contains_key(k)).count() as u64;
        let decode = rep.active.len() as u64 + rep.unkeyed + fresh + unkeyed;
        Estimate {
            cost: self.weight * (rep.prefill + prefill) + decode as f64,
            prefill,
            keys,
            unkeyed,
        }
    }

    /// The blocks replica `k` caches, as the router knows them: key → a bit per tier (GPU 1, host 2).
    pub(super) fn known(&self, k: usize) -> &HashMap<u64, u8> {
        &self.replicas[k].cached
    }

    #[cfg(test)]
    fn cached(&self, k: usize) -> usize {
        self.known(k).len()
    }
}

impl Replica {
    fn apply(&mut self, e: &KvEvent) {
        let bit = match e.tier {
            Tier::Gpu => 1,
            Tier::Host => 2,
        };
        match e.kind {
            KvEventKind::Stored => *self.cached.entry(e.key).or_default() |= bit,
            KvEventKind::Removed => {
                if let Some(t) = self.cached.get_mut(&e.key) {
                    *t &= !bit;
                    if *t == 0 {
                        self.cached.remove(&e.key);
                    }
                }
            }
            KvEventKind::Cleared => self.cached.clear(),
        }
    }

    /// The keys of `ask`'s full pages as this replica's pool names them (none where the replica never
    /// admitted a request of the adapter).
    fn keys(&self, ask: &Ask<'_>) -> Vec<u64> {
        let Some(&root) = self.roots.get(&ask.adapter) else {
            return Vec::new();
        };
        ask.hashes
            .iter()
            .scan(root, |key, &h| {
                *key = chain(*key, h);
                Some(*key)
            })
            .collect()
    }

    fn forget(&mut self, r: &Routed) {
        self.prefill -= r.prefill;
        for key in &r.keys {
            if let Some(n) = self.active.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    self.active.remove(key);
                }
            }
        }
        self.unkeyed -= r.unkeyed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(key: u64) -> KvEvent {
        KvEvent {
            kind: KvEventKind::Stored,
            tier: Tier::Gpu,
            key,
            parent: 0,
        }
    }

    fn keys(root: u64, hashes: &[u64]) -> Vec<u64> {
        hashes
            .iter()
            .scan(root, |k, &h| {
                *k = chain(*k, h);
                Some(*k)
            })
            .collect()
    }

    fn ask(arrival: usize, hashes: &[u64]) -> Ask<'_> {
        Ask {
            arrival,
            adapter: None,
            prompt: 16 * hashes.len() as u32,
            hashes,
        }
    }

    fn told(root: u64) -> News {
        News {
            roots: vec![(None, root)],
            ..News::default()
        }
    }

    #[test]
    fn a_prompt_goes_where_its_prefix_is_cached() {
        let mut r = KvRouter::new(2, 16, OVERLAP_WEIGHT);
        let prompt = [1, 2, 3, 4, 5, 6, 7, 8];
        let events: Vec<KvEvent> = keys(99, &prompt[..6]).into_iter().map(stored).collect();
        r.heard(0, &[], told(99));
        r.heard(1, &events, told(99));
        assert_eq!(r.cached(1), 6);
        assert_eq!(
            r.pick(&ask(0, &prompt), &[0, 0]),
            1,
            "6 of 8 blocks cached on 1"
        );
    }

    #[test]
    fn load_outweighs_a_small_overlap() {
        let mut r = KvRouter::new(2, 16, OVERLAP_WEIGHT);
        r.heard(0, &[], told(7));
        r.heard(1, &[stored(keys(7, &[1])[0])], told(7));
        // Replica 1 is busy with a long prompt's prefill.
        let long: Vec<u64> = (100..164).collect();
        assert_eq!(
            r.pick(&ask(0, &long), &[0, 0]),
            0,
            "empty replicas: the first"
        );
        let busy = r.pick(&ask(1, &(200..264).collect::<Vec<_>>()), &[1, 0]);
        assert_eq!(busy, 1, "replica 0 holds 64 blocks of prefill");
        // Now both are busy; a 4-block prompt sharing one cached block on 1 goes to the lighter one.
        let next = r.pick(&ask(2, &[1, 2, 3, 4]), &[1, 1]);
        assert_eq!(
            next, 1,
            "a cached block is one block of prefill less, loads equal"
        );
        // Finishing the first request frees replica 0.
        r.heard(
            0,
            &[],
            News {
                finished: vec![0],
                ..News::default()
            },
        );
        assert_eq!(r.pick(&ask(3, &[1, 2, 3, 4]), &[0, 2]), 0);
    }

    #[test]
    fn the_first_token_ends_the_prefill_count_and_eviction_the_overlap() {
        let mut r = KvRouter::new(2, 16, OVERLAP_WEIGHT);
        let prompt: Vec<u64> = (1..=8).collect();
        let held = keys(5, &prompt);
        r.heard(
            0,
            &held.iter().copied().map(stored).collect::<Vec<_>>(),
            told(5),
        );
        r.heard(1, &[], told(5));
        assert_eq!(r.pick(&ask(0, &prompt), &[0, 0]), 0);
        // Evicted everywhere on replica 0: the next asks go by load only.
        let removed: Vec<KvEvent> = held
            .iter()
            .map(|&key| KvEvent {
                kind: KvEventKind::Removed,
                ..stored(key)
            })
            .collect();
        r.heard(0, &removed, News::default());
        assert_eq!(r.cached(0), 0);
        assert_eq!(
            r.pick(&ask(1, &prompt), &[1, 0]),
            1,
            "replica 0 holds a request"
        );
        // Replica 1's prefill is done; its blocks still count as active (decode).
        r.heard(
            1,
            &[],
            News {
                prefilled: vec![1],
                ..News::default()
            },
        );
        let cleared = KvEvent {
            kind: KvEventKind::Cleared,
            ..KvEvent::default()
        };
        assert!(
            r.replicas[1].prefill.abs() < 1e-9,
            "its prompt work is done"
        );
        r.heard(1, &[cleared], News::default());
        assert_eq!(r.cached(1), 0);
    }

    #[test]
    fn an_adapter_never_admitted_on_a_replica_matches_nothing_there() {
        let mut r = KvRouter::new(2, 16, OVERLAP_WEIGHT);
        let prompt = [1, 2, 3, 4];
        r.heard(
            0,
            &keys(5, &prompt).into_iter().map(stored).collect::<Vec<_>>(),
            told(5),
        );
        let lora = Ask {
            adapter: Some(3),
            ..ask(0, &prompt)
        };
        assert!(r.replicas[0].keys(&lora).is_empty());
        assert_eq!(
            r.pick(&lora, &[0, 0]),
            0,
            "no overlap anywhere: ties by load, index"
        );
    }
}
