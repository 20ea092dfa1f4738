//! Token identity on every lifecycle path: requests served by the [`Engine`] on kvsched's real
//! scheduler — batched, chunked, prefix-shared, suspended to the host tier, recompute-paused,
//! preempted, under GUARANTEED_NO_EVICT, on LoRA adapters that are evicted and reloaded — each
//! produce exactly the tokens (and bit-identical logits) of the same request run alone by the
//! [`Reference`](kvsched_engine::Reference) in this process. Free pages are filled with NaN after
//! every step, so a stale read shows up as a wrong token.
//!
//! Each test asserts the counters of the path it claims and prints them on one line.

mod common;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use common::{assert_identical, reference, Outcome};
use kvsched_engine::{
    CapacityPolicy, ChunkPolicy, Chunking, Completion, Engine, EngineConfig, EngineStats, Lora,
    Message, Model, Ownership, Sampler, SchedulerConfig,
};

/// New tokens a request generates at most.
const NEW: usize = 16;
const TPB: u32 = 8;

const QUESTIONS: [&str; 8] = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Why is the sky blue?",
    "Name a famous painter.",
    "How many legs does a spider have?",
    "What do bees make?",
    "Translate 'good morning' into Spanish.",
];

const SYSTEM: &str = "You are a careful assistant for a public library. Answer every question \
    briefly and politely, in plain English, without lists unless asked, and never invent facts: \
    when you do not know something, say so and suggest where the reader could look it up.";

/// A request of a test: its prompt and adapter (id, seed).
#[derive(Clone, Debug)]
struct Req {
    prompt: Vec<u32>,
    adapter: Option<u64>,
    max_new: usize,
}

fn chat(model: &Model, system: Option<&str>, question: &str) -> Vec<u32> {
    let mut messages = Vec::new();
    if let Some(s) = system {
        messages.push(Message::system(s));
    }
    messages.push(Message::user(question));
    model.tokenizer().encode_chat(&messages, true).unwrap()
}

fn requests(model: &Model, n: usize, system: Option<&str>) -> Vec<Req> {
    QUESTIONS[..n]
        .iter()
        .map(|q| Req {
            prompt: chat(model, system, q),
            adapter: None,
            max_new: NEW,
        })
        .collect()
}

/// The seeded adapter of id `id`.
fn lora(model: &Model, id: u64) -> Lora {
    Lora::seeded(model.config(), 8, 16.0, 0.1, id)
}

/// The reference outcome of a request, computed once per test binary.
fn solo(model: &Model, r: &Req) -> Outcome {
    type Key = (Vec<u32>, Option<u64>, usize);
    static CACHE: OnceLock<Mutex<HashMap<Key, Outcome>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (r.prompt.clone(), r.adapter, r.max_new);
    if let Some(o) = cache.lock().unwrap().get(&key) {
        return o.clone();
    }
    let o = reference(
        model,
        &r.prompt,
        r.max_new,
        r.adapter.map(|id| lora(model, id)),
    );
    cache.lock().unwrap().insert(key, o.clone());
    o
}

/// A test engine: small pages, NaN in free pages, logits kept.
fn config(scheduler: SchedulerConfig, gpu_pages: u32, host_pages: u32) -> EngineConfig {
    EngineConfig {
        scheduler,
        tokens_per_block: TPB,
        gpu_pages,
        host_pages,
        max_blocks: 64,
        poison: true,
        keep_logits: true,
        ..EngineConfig::default()
    }
}

fn sched(tokens: u32, chunking: Option<Chunking>) -> SchedulerConfig {
    SchedulerConfig {
        max_num_requests: 16,
        max_num_tokens: Some(tokens),
        chunking,
        ..EngineConfig::default().scheduler
    }
}

fn chunked(policy: ChunkPolicy, unit: u32) -> Chunking {
    Chunking { policy, unit }
}

/// Registers the requests' adapters, submits them all and runs to the end.
fn serve(engine: &mut Engine<'_>, reqs: &[Req]) -> Vec<Completion> {
    let model = engine.model();
    let mut ids: Vec<u64> = reqs.iter().filter_map(|r| r.adapter).collect();
    ids.sort_unstable();
    ids.dedup();
    for id in ids {
        engine.register_adapter(id, &lora(model, id)).unwrap();
    }
    for r in reqs {
        engine
            .submit(&r.prompt, r.max_new, r.adapter, Sampler::greedy())
            .unwrap();
    }
    engine.run().unwrap()
}

/// Every completion (in submission order) equals its request's solo run.
fn assert_solo(model: &Model, what: &str, reqs: &[Req], got: &[Completion]) {
    assert_eq!(got.len(), reqs.len(), "{what}: every request finished");
    for (i, (r, c)) in reqs.iter().zip(got).enumerate() {
        assert_eq!(c.prompt, r.prompt, "{what}: request {i}'s prompt");
        let outcome = Outcome {
            tokens: c.tokens.clone(),
            logits: c.logits.clone(),
        };
        assert_identical(&format!("{what}, request {i}"), &outcome, &solo(model, r));
    }
}

fn summary(what: &str, requests: usize, s: &EngineStats) {
    eprintln!(
        "{what}: {requests} requests, {} tokens, {} steps, {} chunks, batch {}, {} suspensions, \
         ({} evictions), {} recomputes ({} preemptions), {} prefix-reused tokens, {} adapter loads",
        s.tokens,
        s.model_steps,
        s.context_chunks,
        s.largest_batch,
        s.suspensions,
        s.evictions,
        s.recomputes,
        s.preemptions,
        s.prefix_reused_tokens,
        s.adapter_loads
    );
}

fn batched_and_chunked(policy: ChunkPolicy) {
    let Some(model) = common::model() else { return };
    let reqs = requests(model, 8, None);
    let cfg = config(sched(24, Some(chunked(policy, 8))), 128, 0);
    let mut engine = Engine::new(model, cfg).unwrap();
    let got = serve(&mut engine, &reqs);
    let s = engine.stats();
    summary(&format!("batched, chunked ({policy:?})"), reqs.len(), &s);
    assert_solo(model, &format!("{policy:?}"), &reqs, &got);
    assert!(
        s.context_chunks > reqs.len() as u64,
        "some prompt is chunked"
    );
    assert!(s.largest_batch >= 4, "decode steps are batched");
}

#[test]
fn batched_decode_and_chunked_prefill_fcfs() {
    batched_and_chunked(ChunkPolicy::FirstComeFirstServed);
}

#[test]
fn batched_decode_and_chunked_prefill_equal_progress() {
    batched_and_chunked(ChunkPolicy::EqualProgress);
}

#[test]
fn batched_decode_and_chunked_prefill_force_chunk() {
    batched_and_chunked(ChunkPolicy::ForceChunk);
}

#[test]
fn prefix_sharing_reuses_the_system_prompt() {
    let Some(model) = common::model() else { return };
    let reqs = requests(model, 6, Some(SYSTEM));
    let mut cfg = config(
        sched(48, Some(chunked(ChunkPolicy::FirstComeFirstServed, 8))),
        128,
        0,
    );
    cfg.prefix_cache = true;
    let mut engine = Engine::new(model, cfg).unwrap();
    let got = serve(&mut engine, &reqs);
    let s = engine.stats();
    summary("prefix sharing", reqs.len(), &s);
    assert_solo(model, "prefix sharing", &reqs, &got);
    assert!(s.prefix_reused_tokens > 0, "the system prompt is reused");
}

#[test]
fn suspension_to_the_host_tier_and_resume() {
    let Some(model) = common::model() else { return };
    let reqs = requests(model, 8, None);
    let cfg = config(sched(64, None), 28, 96);
    let mut engine = Engine::new(model, cfg).unwrap();
    let got = serve(&mut engine, &reqs);
    let s = engine.stats();
    summary("suspension", reqs.len(), &s);
    assert_solo(model, "suspension", &reqs, &got);
    assert!(s.evictions > 0, "requests are suspended under KV pressure");
    assert!(s.pages_offloaded > 0 && s.pages_reloaded > 0, "and resumed");
}

#[test]
fn recompute_pause_without_a_host_tier() {
    let Some(model) = common::model() else { return };
    let reqs = requests(model, 8, None);
    let cfg = config(sched(64, None), 28, 0);
    let mut engine = Engine::new(model, cfg).unwrap();
    let got = serve(&mut engine, &reqs);
    let s = engine.stats();
    summary("recompute pause", reqs.len(), &s);
    assert_solo(model, "recompute pause", &reqs, &got);
    assert!(s.recomputes > 0, "requests are recompute-paused");
}

#[test]
fn context_side_preemption() {
    let Some(model) = common::model() else { return };
    let reqs = requests(model, 8, None);
    // Contexts prefilled side by side, a unit each a pass, into a pool that cannot hold them all.
    let cfg = config(
        sched(16, Some(chunked(ChunkPolicy::EqualProgress, 4))),
        20,
        0,
    );
    let mut engine = Engine::new(model, cfg).unwrap();
    let got = serve(&mut engine, &reqs);
    let s = engine.stats();
    summary("context-side preemption", reqs.len(), &s);
    assert_solo(model, "preemption", &reqs, &got);
    assert!(s.preemptions > 0, "context requests preempt others");
}

#[test]
fn guaranteed_no_evict_queues_instead_of_evicting() {
    let Some(model) = common::model() else { return };
    let reqs = requests(model, 8, None);
    let mut scheduler = sched(48, Some(chunked(ChunkPolicy::FirstComeFirstServed, 8)));
    scheduler.policy = CapacityPolicy::GuaranteedNoEvict;
    let gpu_pages = 28;
    let whole: u32 = reqs
        .iter()
        .map(|r| (r.prompt.len() + NEW).div_ceil(TPB as usize) as u32)
        .sum();
    assert!(whole > gpu_pages, "the pool cannot hold every reservation");
    let mut engine = Engine::new(model, config(scheduler, gpu_pages, 0)).unwrap();
    let got = serve(&mut engine, &reqs);
    let s = engine.stats();
    summary("guaranteed no evict", reqs.len(), &s);
    assert_solo(model, "guaranteed no evict", &reqs, &got);
    assert_eq!((s.evictions, s.recomputes), (0, 0), "nothing is evicted");
}

/// The seeds' case: a device adapter cache that holds exactly one adapter. A decoding request on
/// adapter A is suspended under KV pressure; in the same pass a context request on adapter B, which
/// waited for the device, is admitted, and `ensure_batch` loads B in A's place; A resumes later
/// with A reloaded. Every request equals its solo run.
///
/// In arrival order: X (base model), C (adapter A, a two-token request), B (adapter B: it waits,
/// the device holds A), A (adapter A, decoding beside X). C finishes, so only A's lease pins the
/// device copy; when the pool runs out of pages A is suspended, its lease returned, and B, ahead
/// of it in arrival order, gets the device.
#[test]
fn a_suspended_adapter_request_yields_the_device_to_another_adapter() {
    let Some(model) = common::model() else { return };
    let (a, b) = (1u64, 2u64);
    let page = 256 * 1024;
    let pages = lora(model, a).pages(page) as u32;
    let mut cfg = config(sched(64, None), 11, 64);
    cfg.adapter_page_bytes = page;
    cfg.adapter_device_pages = pages;
    cfg.adapter_host_pages = 2 * pages;
    let req = |q: &str, adapter| Req {
        prompt: chat(model, None, q),
        adapter,
        max_new: NEW,
    };
    let short = Req {
        prompt: model.tokenizer().encode("Hello there").unwrap(),
        adapter: Some(a),
        max_new: 2,
    };
    let reqs = [
        req(QUESTIONS[3], None),
        short,
        req(QUESTIONS[2], Some(b)),
        req(QUESTIONS[1], Some(a)),
    ];
    let mut engine = Engine::new(model, cfg).unwrap();
    for id in [a, b] {
        engine.register_adapter(id, &lora(model, id)).unwrap();
    }
    let ids: Vec<u64> = reqs
        .iter()
        .map(|r| {
            engine
                .submit(&r.prompt, r.max_new, r.adapter, Sampler::greedy())
                .unwrap()
        })
        .collect();
    let (mut done, mut overlap) = (Vec::new(), false);
    while !engine.is_empty() {
        done.extend(engine.step().unwrap());
        overlap |= engine.ownership(ids[3]) == Some(Ownership::Paused)
            && engine.ownership(ids[2]).is_some_and(Ownership::on_gpu);
        assert!(engine.stats().steps < 500, "the loop drains");
    }
    let s = engine.stats();
    summary("adapter suspended, another loaded", reqs.len(), &s);
    assert!(overlap, "B ran while A was suspended");
    done.sort_by_key(|c| c.id);
    assert_solo(model, "seeds' case", &reqs, &done);
    assert!(s.evictions > 0, "A was suspended under KV pressure");
    assert!(
        s.adapter_loads >= 3 && s.adapter_evictions >= 2,
        "A loaded, B in its place, A again: {s:?}"
    );
}

/// The adapters really change the model: a LoRA request's tokens differ from the base model's for
/// most prompts (so the identity tests would notice a wrong adapter).
#[test]
fn adapters_change_the_tokens_of_most_prompts() {
    let Some(model) = common::model() else { return };
    let prompts: Vec<Vec<u32>> = QUESTIONS[..4]
        .iter()
        .map(|q| chat(model, None, q))
        .collect();
    let mut differ = 0;
    for (i, p) in prompts.iter().enumerate() {
        let plain = Req {
            prompt: p.clone(),
            adapter: None,
            max_new: NEW,
        };
        let tuned = Req {
            adapter: Some(1 + i as u64 % 2),
            ..plain.clone()
        };
        differ += usize::from(solo(model, &plain).tokens != solo(model, &tuned).tokens);
    }
    eprintln!("adapters: {differ} of {} prompts changed", prompts.len());
    assert!(differ * 2 > prompts.len(), "{differ} of {}", prompts.len());
}
