//! Parallel sampling on forks (issue 44, `Engine::submit_samples`): every sample of a prompt, its
//! prompt computed once and its pages shared, draws exactly the tokens — from bit-identical logits —
//! of the same seed run alone on a fresh engine; on a roomy pool, under a tiny pool with a host tier
//! (children suspended and resumed) and without one (recompute-paused). Free pages are NaN after
//! every step, so a read of a page a sibling gave up shows up as a wrong token.

mod common;

use std::collections::HashMap;

use common::{assert_identical, Outcome};
use kvsched_engine::{
    Completion, Engine, EngineConfig, EngineStats, Message, Model, Sample, Sampler, SchedulerConfig,
};

const TPB: u32 = 8;
const NEW: usize = 16;
const N: usize = 4;

const QUESTIONS: [&str; 3] = [
    "Write a haiku about the sea.",
    "Why is the sky blue? Answer in two sentences.",
    "Name three famous painters and one painting by each.",
];

fn config(gpu_pages: u32, host_pages: u32, prefix_cache: bool) -> EngineConfig {
    EngineConfig {
        scheduler: SchedulerConfig {
            max_num_requests: 16,
            max_num_tokens: Some(64),
            ..EngineConfig::default().scheduler
        },
        tokens_per_block: TPB,
        gpu_pages,
        host_pages,
        max_blocks: 64,
        prefix_cache,
        poison: true,
        keep_logits: true,
        ..EngineConfig::default()
    }
}

fn prompt(model: &Model, q: &str) -> Vec<u32> {
    model
        .tokenizer()
        .encode_chat(&[Message::user(q)], true)
        .unwrap()
}

/// Sample `i` of a request seeded `seed`: vLLM's child seed, `seed + i`.
fn sampler(seed: u64, i: usize) -> Sampler {
    Sampler::seeded(seed + i as u64, 0.8)
}

/// The sample run alone on a fresh, roomy engine without a prefix cache.
fn alone(model: &Model, prompt: &[u32], s: Sampler) -> Outcome {
    let mut e = Engine::new(model, config(256, 0, false)).unwrap();
    e.submit(prompt, NEW, None, s).unwrap();
    let c = e.run().unwrap().remove(0);
    Outcome {
        tokens: c.tokens,
        logits: c.logits,
    }
}

/// Every question's `N` samples on `engine`, submitted together; the completions by id.
fn serve(
    engine: &mut Engine<'_>,
    prompts: &[Vec<u32>],
) -> (Vec<Vec<u64>>, HashMap<u64, Completion>) {
    let ids: Vec<Vec<u64>> = prompts
        .iter()
        .enumerate()
        .map(|(q, p)| {
            let all = samples(100 * q as u64);
            engine.submit_samples(p, NEW, None, all, 0).unwrap()
        })
        .collect();
    let done = engine
        .run()
        .unwrap()
        .into_iter()
        .map(|c| (c.id, c))
        .collect();
    (ids, done)
}

fn check(model: &Model, what: &str, engine: &mut Engine<'_>) -> EngineStats {
    let prompts: Vec<Vec<u32>> = QUESTIONS.iter().map(|q| prompt(model, q)).collect();
    let (ids, done) = serve(engine, &prompts);
    for (q, p) in prompts.iter().enumerate() {
        let mut texts = Vec::new();
        for (i, id) in ids[q].iter().enumerate() {
            let c = &done[id];
            assert_eq!(&c.prompt, p, "{what}: question {q} sample {i}'s prompt");
            let got = Outcome {
                tokens: c.tokens.clone(),
                logits: c.logits.clone(),
            };
            let want = alone(model, p, sampler(100 * q as u64, i));
            assert_identical(&format!("{what}: question {q} sample {i}"), &got, &want);
            texts.push(c.tokens.clone());
        }
        texts.dedup();
        assert!(texts.len() > 1, "{what}: question {q}'s samples differ");
    }
    let s = engine.stats();
    eprintln!(
        "{what}: {} forks sharing {} prompt positions, {} suspensions ({} pages offloaded, {} reloaded), \
         {} recomputes ({} preemptions), {} steps",
        s.forks, s.fork_shared_tokens, s.suspensions, s.pages_offloaded, s.pages_reloaded, s.recomputes,
        s.preemptions, s.model_steps
    );
    let shared: u64 = prompts
        .iter()
        .map(|p| ((p.len() as u64 - 1) / u64::from(TPB)) * u64::from(TPB))
        .sum();
    assert!(
        s.forks >= (QUESTIONS.len() * (N - 1)) as u64,
        "{what}: every other sample is a fork"
    );
    assert!(
        s.fork_shared_tokens >= shared * (N as u64 - 1),
        "{what}: each shares the prompt's full blocks"
    );
    s
}

#[test]
fn each_sample_equals_its_seed_run_alone_on_a_roomy_pool() {
    let Some(model) = common::model() else { return };
    let mut e = Engine::new(model, config(256, 0, true)).unwrap();
    let s = check(model, "roomy", &mut e);
    assert_eq!((s.suspensions, s.recomputes), (0, 0));
}

#[test]
fn children_suspended_to_the_host_tier_and_resumed() {
    let Some(model) = common::model() else { return };
    let mut e = Engine::new(model, config(24, 96, true)).unwrap();
    let s = check(model, "tiny pool, host tier", &mut e);
    assert!(
        s.pages_offloaded > 0 && s.pages_reloaded > 0,
        "samples are suspended and resumed"
    );
}

#[test]
fn children_recompute_paused_without_a_host_tier() {
    let Some(model) = common::model() else { return };
    let mut e = Engine::new(model, config(24, 0, true)).unwrap();
    let s = check(model, "tiny pool, no host tier", &mut e);
    assert!(s.recomputes > 0, "samples are recompute-paused");
}

#[test]
fn without_a_prefix_cache_each_sample_is_a_request_of_its_own() {
    let Some(model) = common::model() else { return };
    let mut e = Engine::new(model, config(256, 0, false)).unwrap();
    let p = prompt(model, QUESTIONS[0]);
    let ids = e.submit_samples(&p, NEW, None, samples(0), 0).unwrap();
    assert_eq!(e.len(), N, "all submitted at once");
    let done: HashMap<u64, Completion> = e.run().unwrap().into_iter().map(|c| (c.id, c)).collect();
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(done[id].tokens, alone(model, &p, sampler(0, i)).tokens);
    }
    assert_eq!(e.stats().forks, 0);
}

/// Cancelling the first sample before its samples are forked leaves them to run alone (another
/// sample's client may still want them: the server cancels the first on its stop string); a waiting
/// sample is cancelled by its own id.
#[test]
fn cancelling_the_first_sample_leaves_the_others_to_run() {
    let Some(model) = common::model() else { return };
    let mut e = Engine::new(model, config(256, 0, true)).unwrap();
    let p = prompt(model, QUESTIONS[1]);
    let ids = e.submit_samples(&p, NEW, None, samples(0), 0).unwrap();
    assert!(
        e.cancel(ids[2]).unwrap(),
        "a waiting sample is cancelled alone"
    );
    assert!(e.cancel(ids[0]).unwrap());
    assert_eq!(e.waiting_samples(), 2);
    let done: HashMap<u64, Completion> = e.run().unwrap().into_iter().map(|c| (c.id, c)).collect();
    let mut finished: Vec<u64> = done.keys().copied().collect();
    finished.sort_unstable();
    assert_eq!(finished, [ids[1], ids[3]]);
    for i in [1, 3] {
        assert_eq!(
            done[&ids[i]].tokens,
            alone_tokens(model, &p, NEW, 0, i),
            "sample {i}"
        );
    }
}

/// A first sample that ends in the step its prompt is computed still has its samples forked.
#[test]
fn a_first_sample_that_ends_at_once_still_forks_its_samples() {
    let Some(model) = common::model() else { return };
    let mut e = Engine::new(model, config(256, 0, true)).unwrap();
    let p = prompt(model, QUESTIONS[2]);
    let ids = e.submit_samples(&p, 1, None, samples(9), 0).unwrap();
    let done: HashMap<u64, Completion> = e.run().unwrap().into_iter().map(|c| (c.id, c)).collect();
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            done[id].tokens,
            alone_tokens(model, &p, 1, 9, i),
            "sample {i}"
        );
    }
    assert_eq!(e.stats().forks, (N - 1) as u64);
}

/// With the request table full when the first sample's prompt is computed (and the first ending
/// then), the samples wait, detached, and run as requests of their own once there is room; each
/// equals its seed run alone.
#[test]
fn samples_without_room_wait_and_run_alone() {
    let Some(model) = common::model() else { return };
    let mut cfg = config(512, 0, true);
    cfg.scheduler.max_num_requests = kvsched_engine::MAX_REQUESTS as u32;
    cfg.scheduler.max_num_tokens = Some(1024);
    let mut e = Engine::new(model, cfg).unwrap();
    let p = prompt(model, QUESTIONS[2]);
    for _ in 0..kvsched_engine::MAX_REQUESTS - 1 {
        e.submit(&[1, 2, 3], 3, None, Sampler::greedy()).unwrap();
    }
    let ids = e.submit_samples(&p, 1, None, samples(9), 0).unwrap();
    let done: HashMap<u64, Completion> = e.run().unwrap().into_iter().map(|c| (c.id, c)).collect();
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            done[id].tokens,
            alone_tokens(model, &p, 1, 9, i),
            "sample {i}"
        );
    }
    assert_eq!(e.waiting_samples(), 0);
    assert_eq!(e.stats().forks, 0, "no room to fork: each ran alone");
}

fn samples(seed: u64) -> Vec<Sample> {
    (0..N)
        .map(|i| Sample {
            sampler: sampler(seed, i),
            guide: None,
        })
        .collect()
}

/// The tokens of sample `i` (seed `seed + i`) run alone, `max_new` at most.
fn alone_tokens(model: &Model, p: &[u32], max_new: usize, seed: u64, i: usize) -> Vec<u32> {
    let mut e = Engine::new(model, config(256, 0, false)).unwrap();
    e.submit(p, max_new, None, sampler(seed, i)).unwrap();
    e.run().unwrap().remove(0).tokens
}
