//! The serving engine's edges: requests refused at submission with the limit named, a bad
//! configuration refused before anything is allocated, a seeded sampler identical to the same
//! sampler over the reference, and a randomized run over pool sizes, budgets, chunking, prefix
//! caching, arrival orders, adapters and prompt-lookup drafts (`KVSCHED_ENGINE_CASES` cases, default 2), each request
//! identical to its solo run.

mod common;

use common::{assert_identical, reference, Outcome, Rng};
use kvsched_engine::{
    ChunkPolicy, Chunking, Engine, EngineConfig, EngineError, Limit, Lora, Message, Model,
    PromptLookup, Reference, Refusal, Sampler, SchedulerConfig,
};

fn small(max_blocks: u32) -> EngineConfig {
    EngineConfig {
        tokens_per_block: 8,
        gpu_pages: 4,
        max_blocks,
        adapter_device_pages: 1,
        adapter_host_pages: 1,
        adapter_page_bytes: 64,
        ..EngineConfig::default()
    }
}

fn chat(model: &Model, question: &str) -> Vec<u32> {
    model
        .tokenizer()
        .encode_chat(&[Message::user(question)], true)
        .unwrap()
}

#[test]
fn bad_requests_are_refused_naming_the_limit() {
    let Some(model) = common::model() else { return };
    let context = model.config().context_length;
    let mut engine = Engine::new(model, small(4)).unwrap();
    let g = Sampler::greedy;
    let refusal = |r: kvsched_engine::Result<u64>| match r {
        Err(EngineError::Refused(why)) => why,
        other => panic!("not refused: {other:?}"),
    };
    assert!(matches!(
        refusal(engine.submit(&[], 4, None, g())),
        Refusal::EmptyPrompt
    ));
    assert!(matches!(
        refusal(engine.submit(&[1, 2], 0, None, g())),
        Refusal::NoNewTokens
    ));
    let vocab = model.config().vocab as u32;
    let why = refusal(engine.submit(&[1, vocab], 4, None, g()));
    assert!(matches!(why, Refusal::Token { token, .. } if token == vocab));
    let why = refusal(engine.submit(&[7; 30], 3, None, g()));
    assert!(matches!(
        why,
        Refusal::TooLong {
            limit: 32,
            what: Limit::RequestPages,
            ..
        }
    ));
    assert!(why.to_string().contains("of 32 tokens"), "{why}");
    let why = refusal(engine.submit(&[7; 4], 1, Some(9), g()));
    assert!(matches!(why, Refusal::UnknownAdapter(9)), "{why}");
    assert!(engine.is_empty(), "nothing was queued");

    let mut long = Engine::new(model, small((context / 8) as u32)).unwrap();
    let why = refusal(long.submit(&vec![7; context], 1, None, g()));
    assert!(matches!(
        why,
        Refusal::TooLong {
            what: Limit::ModelContext,
            ..
        }
    ));
    assert!(why.to_string().contains(&context.to_string()), "{why}");
}

#[test]
fn a_bad_configuration_is_refused() {
    let Some(model) = common::model() else { return };
    for cfg in [
        EngineConfig {
            tokens_per_block: 0,
            ..small(4)
        },
        EngineConfig {
            max_blocks: 100_000,
            ..small(4)
        },
        EngineConfig {
            adapter_page_bytes: 0,
            ..small(4)
        },
    ] {
        let err = Engine::new(model, cfg).unwrap_err();
        assert!(matches!(err, EngineError::Config(_)), "{err}");
    }
    let err = Engine::new(
        model,
        EngineConfig {
            gpu_pages: 0,
            ..small(4)
        },
    )
    .unwrap_err();
    assert!(matches!(err, EngineError::Scheduler(_)), "{err}");
}

/// The reference with a sampler: the whole prompt, then a token at a time.
fn sampled_alone(model: &Model, prompt: &[u32], max_new: usize, mut s: Sampler) -> Vec<u32> {
    let mut r = Reference::new(model, prompt.len() + max_new, None);
    let mut logits = r.feed(prompt).unwrap();
    let mut out = Vec::new();
    loop {
        let next = s.sample(&logits);
        out.push(next);
        if out.len() == max_new || model.tokenizer().is_stop(next) {
            return out;
        }
        logits = r.feed(&[next]).unwrap();
    }
}

#[test]
fn a_seeded_sampler_draws_what_it_draws_alone() {
    let Some(model) = common::model() else { return };
    let questions = ["Tell me a story.", "Describe a cat.", "Invent a word."];
    let mut engine = Engine::new(
        model,
        EngineConfig {
            tokens_per_block: 8,
            gpu_pages: 40,
            poison: true,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let samplers: Vec<Sampler> = (0..3).map(|i| Sampler::seeded(40 + i, 0.9)).collect();
    for (q, s) in questions.iter().zip(&samplers) {
        engine.submit(&chat(model, q), 12, None, s.clone()).unwrap();
    }
    let got = engine.run().unwrap();
    let mut greedy_differs = 0;
    for ((c, q), s) in got.iter().zip(&questions).zip(&samplers) {
        let want = sampled_alone(model, &chat(model, q), 12, s.clone());
        assert_eq!(c.tokens, want, "{q}");
        greedy_differs +=
            usize::from(sampled_alone(model, &c.prompt, 12, Sampler::greedy()) != want);
    }
    assert!(greedy_differs > 0, "the sampler is not greedy");
}

/// A random engine whose GPU tier holds one to two of the longest request (`longest` positions).
fn random_config(model: &Model, rng: &mut Rng, longest: usize) -> EngineConfig {
    let tpb = [4u32, 8, 16][rng.below(3)];
    let least = longest.div_ceil(tpb as usize) as u32 + 1;
    let policy = [
        ChunkPolicy::FirstComeFirstServed,
        ChunkPolicy::EqualProgress,
        ChunkPolicy::ForceChunk,
    ][rng.below(3)];
    let chunking = (rng.below(3) != 0).then(|| Chunking {
        policy,
        unit: 1 + rng.below(12) as u32,
    });
    let scheduler = SchedulerConfig {
        max_num_requests: 2 + rng.below(6) as u32,
        max_num_tokens: Some(longest as u32 + 8 + rng.below(64) as u32),
        chunking,
        ..EngineConfig::default().scheduler
    };
    // Half the cases decode with prompt-lookup drafts of random n-gram and draft lengths.
    let speculative = (rng.below(2) == 0).then(|| PromptLookup {
        max_ngram: 1 + rng.below(3),
        min_ngram: 1,
        max_draft: 1 + rng.below(5),
    });
    let lora_pages = Lora::seeded(model.config(), 8, 16.0, 0.1, 1).pages(256 * 1024) as u32;
    EngineConfig {
        scheduler,
        tokens_per_block: tpb,
        gpu_pages: least + rng.below(least as usize) as u32,
        host_pages: [0, 2 * least][rng.below(2)],
        max_blocks: least + 1,
        prefix_cache: rng.below(2) == 0,
        adapter_device_pages: lora_pages * (1 + rng.below(2) as u32),
        adapter_host_pages: lora_pages * 2,
        poison: true,
        keep_logits: true,
        speculative,
        ..EngineConfig::default()
    }
}

/// One random serving configuration and workload.
fn random_case(model: &Model, rng: &mut Rng, case: u64) {
    let questions = [
        "What is the capital of Italy?",
        "Name two colours.",
        "Why do cats purr?",
        "Count to five.",
        "What is rain?",
        "Say hello in French.",
    ];
    let n = 3 + rng.below(4);
    let new = 6 + rng.below(8);
    let adapters = rng.below(3) as u64;
    let reqs: Vec<(Vec<u32>, Option<u64>)> = (0..n)
        .map(|_| {
            let q = questions[rng.below(questions.len())];
            let adapter = (adapters > 0 && rng.below(3) != 0)
                .then(|| 1 + rng.below(adapters as usize) as u64);
            (chat(model, q), adapter)
        })
        .collect();
    let longest = reqs.iter().map(|r| r.0.len() + new).max().unwrap();
    let cfg = random_config(model, rng, longest);
    let mut engine = Engine::new(model, cfg).unwrap();
    for id in 1..=adapters {
        let lora = Lora::seeded(model.config(), 8, 16.0, 0.1, id);
        engine.register_adapter(id, &lora).unwrap();
    }
    // Arrivals: each request joins after a random number of steps.
    let mut order: Vec<usize> = (0..n).collect();
    rng.shuffle(&mut order);
    let mut ids = vec![0; n];
    let mut done = Vec::new();
    for &i in &order {
        ids[i] = engine
            .submit(&reqs[i].0, new, reqs[i].1, Sampler::greedy())
            .unwrap();
        for _ in 0..rng.below(4) {
            done.extend(engine.step().unwrap());
        }
    }
    done.extend(engine.run().unwrap());
    let s = engine.stats();
    eprintln!(
        "case {case}: {n} requests, {} tokens, {} suspensions ({} evictions), {} recomputes, \
         {} prefix-reused tokens, {} adapter loads, drafts {} accepted {} rejected; {cfg:?}",
        s.tokens,
        s.suspensions,
        s.evictions,
        s.recomputes,
        s.prefix_reused_tokens,
        s.adapter_loads,
        s.drafts_accepted,
        s.drafts_rejected
    );
    assert_eq!(done.len(), n, "case {case}: every request finished");
    for (i, (prompt, adapter)) in reqs.iter().enumerate() {
        let c = done.iter().find(|c| c.id == ids[i]).unwrap();
        let lora = adapter.map(|id| Lora::seeded(model.config(), 8, 16.0, 0.1, id));
        let want = reference(model, prompt, new, lora);
        let got = Outcome {
            tokens: c.tokens.clone(),
            logits: c.logits.clone(),
        };
        assert_identical(&format!("case {case}, request {i}"), &got, &want);
    }
}

#[test]
fn random_pools_budgets_arrivals_and_adapters_equal_the_solo_runs() {
    let Some(model) = common::model() else { return };
    let cases: u64 = std::env::var("KVSCHED_ENGINE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let seed: u64 = std::env::var("KVSCHED_ENGINE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed);
    for case in 0..cases {
        let mut rng = Rng(seed ^ (case + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        random_case(model, &mut rng, case);
    }
}
