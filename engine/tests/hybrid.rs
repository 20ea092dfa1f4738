//! The hybrid mechanism model served by [`HybridEngine`] on kvsched's state slots: under every
//! lifecycle path the scheduler takes — batched and chunked prefill (each chunking policy, chunks
//! that end between snapshot points), suspension to the host tier and back, recompute pause,
//! context-side preemption, GUARANTEED_NO_EVICT, a prefix hit that resumes from a snapshot, a
//! multi-turn follow-up — every request's tokens and logits equal, bit for bit, the same request run
//! alone on contiguous memory ([`HybridModel::reference`]), with free pages and state slots filled
//! with NaN after every step.
//!
//! Each test prints its counters on one line.

use kvsched_core::state_pool::StateConfig;
use kvsched_engine::{
    CapacityPolicy, ChunkPolicy, Chunking, HybridCompletion, HybridConfig, HybridEngine,
    HybridModel, HybridSpec, HybridStats, SchedulerConfig,
};

const TPB: u32 = 16;
/// Snapshot points every two blocks.
const INTERVAL: u32 = 32;
const NEW: usize = 6;
/// New tokens a request generates where the pool is to run short (decodes that outgrow it).
const LONG: usize = 48;

fn model() -> HybridModel {
    HybridModel::new(HybridSpec::SMALL).expect("a valid spec")
}

/// `n` pseudo-random tokens of seed `seed`.
fn prompt(n: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 64) as u32
        })
        .collect()
}

fn state(gpu: u32, host: u32, snapshots: u32) -> StateConfig {
    StateConfig {
        slot_bytes: 1,
        gpu_slots: gpu,
        host_slots: host,
        snapshot_slots: snapshots,
        snapshot_interval: INTERVAL,
    }
}

/// Chunks of at most `unit` tokens under `policy` in a budget of 48 tokens a step, `pages` KV pages
/// on each tier, a state group of `st`, NaN in free memory.
fn config(policy: ChunkPolicy, unit: u32, pages: [u32; 2], st: StateConfig) -> HybridConfig {
    HybridConfig {
        tokens_per_block: TPB,
        pages,
        state: st,
        scheduler: SchedulerConfig {
            max_num_requests: 8,
            max_num_tokens: Some(48),
            chunking: Some(Chunking { policy, unit }),
            ..SchedulerConfig::default()
        },
        poison: true,
    }
}

/// Submits `(id, prompt)` for `new` tokens each, runs them all, and checks each against its solo
/// run; returns the stats and the completions.
fn served(
    m: &HybridModel,
    cfg: HybridConfig,
    reqs: &[(u64, Vec<u32>)],
    new: usize,
) -> (HybridStats, Vec<HybridCompletion>) {
    let mut e = HybridEngine::new(m, cfg).expect("a valid engine");
    for (id, p) in reqs {
        e.submit(*id, p, new).expect("submitted");
    }
    let done = e.run().expect("every request finishes");
    assert_eq!(done.len(), reqs.len());
    for (c, (id, p)) in done.iter().zip(reqs) {
        assert_eq!(c.id, *id);
        identical(m, p, c, new);
    }
    (e.stats(), done)
}

/// `c` equals `prompt` run alone for `new` tokens: tokens, and logits bit for bit.
fn identical(m: &HybridModel, prompt: &[u32], c: &HybridCompletion, new: usize) {
    let (tokens, logits) = m.reference(prompt, new);
    assert_eq!(c.tokens, tokens, "request {}: tokens", c.id);
    for (i, (a, b)) in c.logits.iter().zip(&logits).enumerate() {
        let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "request {}: logits of token {i} differ", c.id);
    }
}

fn six() -> Vec<(u64, Vec<u32>)> {
    [37, 60, 95, 130, 71, 150]
        .iter()
        .enumerate()
        .map(|(i, &n)| (i as u64, prompt(n, i as u64 + 1)))
        .collect()
}

#[test]
fn batched_and_chunked_prefill_equals_solo_under_every_chunking_policy() {
    let m = model();
    for policy in [
        ChunkPolicy::FirstComeFirstServed,
        ChunkPolicy::EqualProgress,
        ChunkPolicy::ForceChunk,
    ] {
        // Chunks of 24: they end between the snapshot points (every 32 tokens).
        let (s, _) = served(
            &m,
            config(policy, 24, [128, 0], state(16, 0, 4)),
            &six(),
            NEW,
        );
        eprintln!("{policy:?}: {s:?}");
        assert!(s.captures > 0, "{s:?}");
    }
}

#[test]
fn suspension_to_the_host_and_back_equals_solo() {
    // 24 GPU pages for six requests of up to 10 pages each; 4 GPU state slots.
    let cfg = config(
        ChunkPolicy::FirstComeFirstServed,
        24,
        [24, 96],
        state(4, 12, 0),
    );
    let (s, _) = served(&model(), cfg, &six(), LONG);
    eprintln!("suspension: {s:?}");
    assert!(s.suspensions > 0 && s.state_moves > 0, "{s:?}");
}

#[test]
fn recompute_pause_equals_solo() {
    let mut cfg = config(
        ChunkPolicy::FirstComeFirstServed,
        24,
        [24, 0],
        state(16, 0, 0),
    );
    cfg.scheduler.recompute_pause = true;
    let (s, _) = served(&model(), cfg, &six(), LONG);
    eprintln!("recompute pause: {s:?}");
    assert!(s.recomputes > 0, "{s:?}");
}

#[test]
fn context_side_preemption_equals_solo() {
    // Contexts prefilled side by side, a unit each a pass, into a pool that cannot hold them all.
    let mut cfg = config(ChunkPolicy::EqualProgress, 4, [20, 0], state(16, 0, 0));
    cfg.scheduler.max_num_tokens = Some(16);
    let (s, _) = served(&model(), cfg, &six(), NEW);
    eprintln!("context-side preemption: {s:?}");
    assert!(s.preemptions > 0, "{s:?}");
}

#[test]
fn guaranteed_no_evict_equals_solo() {
    let mut cfg = config(
        ChunkPolicy::FirstComeFirstServed,
        24,
        [32, 0],
        state(3, 13, 2),
    );
    cfg.scheduler.policy = CapacityPolicy::GuaranteedNoEvict;
    let (s, _) = served(&model(), cfg, &six(), LONG);
    eprintln!("guaranteed no evict: {s:?}");
    assert_eq!(s.suspensions + s.recomputes, 0, "{s:?}");
}

#[test]
fn a_prefix_hit_resumes_from_a_snapshot_and_equals_solo() {
    let m = model();
    let cfg = config(
        ChunkPolicy::FirstComeFirstServed,
        40,
        [128, 0],
        state(8, 8, 4),
    );
    let mut e = HybridEngine::new(&m, cfg).expect("a valid engine");
    let a = prompt(100, 9);
    e.submit(1, &a, NEW).unwrap();
    let first = e.run().unwrap();
    identical(&m, &a, &first[0], NEW);
    let mut b = a.clone();
    b.extend(prompt(30, 10));
    e.submit(2, &b, NEW).unwrap();
    let second = e.run().unwrap();
    identical(&m, &b, &second[0], NEW);
    let s = e.stats();
    eprintln!(
        "prefix hit: cached {} of {}: {s:?}",
        second[0].cached,
        b.len()
    );
    // The deepest snapshot point of A's 100 tokens is 96: B resumes there.
    assert_eq!(second[0].cached, 96);
    assert_eq!(s.snapshot_hits, 1, "{s:?}");
}

#[test]
fn a_multi_turn_follow_up_resumes_from_a_snapshot_and_equals_solo() {
    let m = model();
    let cfg = config(ChunkPolicy::EqualProgress, 24, [128, 0], state(8, 8, 4));
    let mut e = HybridEngine::new(&m, cfg).expect("a valid engine");
    let turn1 = prompt(75, 21);
    e.submit(1, &turn1, NEW).unwrap();
    let answer = e.run().unwrap().remove(0);
    identical(&m, &turn1, &answer, NEW);
    let mut turn2 = turn1.clone();
    turn2.extend(&answer.tokens);
    turn2.extend(prompt(20, 22));
    e.submit(2, &turn2, NEW).unwrap();
    let follow = e.run().unwrap().remove(0);
    identical(&m, &turn2, &follow, NEW);
    let s = e.stats();
    eprintln!(
        "multi-turn: cached {} of {}: {s:?}",
        follow.cached,
        turn2.len()
    );
    assert_eq!(follow.cached, 64, "turn 1's deepest snapshot point");
    assert!(s.snapshot_hits >= 1 && s.captures >= 2, "{s:?}");
}

#[test]
fn bad_input_is_refused() {
    let bad = HybridSpec {
        attention_every: 0,
        ..HybridSpec::SMALL
    };
    assert!(HybridModel::new(bad).is_err(), "no attention layer");
    let m = model();
    let odd = StateConfig {
        snapshot_interval: 24,
        ..state(8, 8, 2)
    };
    let cfg = config(ChunkPolicy::FirstComeFirstServed, 24, [64, 0], odd);
    assert!(
        HybridEngine::new(&m, cfg).is_err(),
        "an interval of 1.5 blocks"
    );
    let cfg = config(
        ChunkPolicy::FirstComeFirstServed,
        24,
        [64, 0],
        state(8, 8, 2),
    );
    let mut e = HybridEngine::new(&m, cfg).unwrap();
    assert!(
        e.submit(1, &[1, 2, 64], 2).is_err(),
        "a token past the vocabulary"
    );
    assert!(e.is_empty());
}
