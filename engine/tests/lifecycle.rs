//! Token identity on the serving paths beyond one request's life: multi-turn conversations whose
//! follow-ups reuse their earlier turns' KV from the prefix cache; speculative decoding with
//! prompt-lookup drafts verified by the model, rejected drafts rewound; disaggregated serving, a
//! prefill engine's KV pages copied into a decode engine's store. Every completion is compared with
//! the same prompt run alone by the [`Reference`](kvsched_engine::Reference) in this process; free
//! pages are filled with NaN after every step.
//!
//! Each test asserts the counters of the path it claims and prints them on one line.

mod common;

use common::{assert_identical, reference, Outcome};
use kvsched_engine::{
    ChunkPolicy, Chunking, Completion, Conversation, Engine, EngineConfig, EngineStats, KvExtent,
    KvTransfer, Message, Model, PromptLookup, Sampler, SchedulerConfig,
};

/// New tokens a request generates at most.
const NEW: usize = 16;
const TPB: u32 = 8;

/// (first question, follow-up) of each conversation.
const CHATS: [(&str, &str); 4] = [
    ("What is the capital of France?", "And of Italy?"),
    (
        "Name a famous painter.",
        "Which of their paintings is best known?",
    ),
    ("List three prime numbers.", "Now add them up."),
    ("What do bees make?", "How do they make it?"),
];

/// A test engine: small pages, NaN in free pages, logits kept, chunked prefill.
fn config(gpu_pages: u32, host_pages: u32) -> EngineConfig {
    EngineConfig {
        scheduler: SchedulerConfig {
            max_num_requests: 16,
            max_num_tokens: Some(64),
            chunking: Some(Chunking {
                policy: ChunkPolicy::FirstComeFirstServed,
                unit: 8,
            }),
            ..EngineConfig::default().scheduler
        },
        tokens_per_block: TPB,
        gpu_pages,
        host_pages,
        max_blocks: 64,
        poison: true,
        keep_logits: true,
        ..EngineConfig::default()
    }
}

/// Every completion equals its prompt's solo run.
fn assert_solo(model: &Model, what: &str, prompts: &[Vec<u32>], got: &[Completion]) {
    assert_eq!(got.len(), prompts.len(), "{what}: every request finished");
    for (i, (p, c)) in prompts.iter().zip(got).enumerate() {
        assert_eq!(&c.prompt, p, "{what}: request {i}'s prompt");
        let outcome = Outcome {
            tokens: c.tokens.clone(),
            logits: c.logits.clone(),
        };
        let want = reference(model, p, NEW, None);
        assert_identical(&format!("{what}, request {i}"), &outcome, &want);
    }
}

fn submit_all(engine: &mut Engine<'_>, prompts: &[Vec<u32>]) {
    for p in prompts {
        engine.submit(p, NEW, None, Sampler::greedy()).unwrap();
    }
}

fn summary(what: &str, requests: usize, s: &EngineStats) {
    eprintln!(
        "{what}: {requests} requests, {} tokens, {} steps, {} chunks, batch {}, {} prefill tokens, \
         {} prefix-reused tokens",
        s.tokens,
        s.model_steps,
        s.context_chunks,
        s.largest_batch,
        s.prefill_tokens,
        s.prefix_reused_tokens,
    );
}

/// Four conversations of two turns: the follow-ups (previous prompt + the answer as generated + the
/// next user message) find their first turn's prompt blocks in the prefix cache, and every turn's
/// tokens equal its full prompt run alone.
#[test]
fn multi_turn_follow_ups_reuse_their_conversation_prefix() {
    let Some(model) = common::model() else { return };
    let tok = model.tokenizer();
    let mut chats: Vec<Conversation> = CHATS
        .iter()
        .map(|(q, _)| Conversation::start(tok, vec![Message::user(*q)]).unwrap())
        .collect();
    let mut cfg = config(128, 0);
    cfg.prefix_cache = true;
    let mut engine = Engine::new(model, cfg).unwrap();
    let first: Vec<Vec<u32>> = chats.iter().map(|c| c.prompt().to_vec()).collect();
    submit_all(&mut engine, &first);
    let answers = engine.run().unwrap();
    assert_solo(model, "first turns", &first, &answers);
    let before = engine.stats();
    let mut bad = chats[0].clone();
    assert!(
        bad.follow_up(tok, &[u32::MAX], "Hi").is_err(),
        "a token outside the vocabulary"
    );
    assert_eq!(bad, chats[0], "a refused follow-up changes nothing");
    let second: Vec<Vec<u32>> = chats
        .iter_mut()
        .zip(&answers)
        .zip(CHATS)
        .map(|((c, a), (_, next))| c.follow_up(tok, &a.tokens, next).unwrap().to_vec())
        .collect();
    for ((p2, p1), a) in second.iter().zip(&first).zip(&answers) {
        assert_eq!(
            p2[..p1.len()],
            p1[..],
            "a follow-up extends its first prompt"
        );
        assert_eq!(p2[p1.len()..p1.len() + a.tokens.len()], a.tokens[..]);
    }
    submit_all(&mut engine, &second);
    let replies = engine.run().unwrap();
    let s = engine.stats();
    summary("multi-turn, second turns", second.len(), &s);
    assert_solo(model, "second turns", &second, &replies);
    let reused = s.prefix_reused_tokens - before.prefix_reused_tokens;
    let blocks: u64 = first
        .iter()
        .map(|p| (p.len() / TPB as usize * TPB as usize) as u64)
        .sum();
    eprintln!(
        "multi-turn: second turns reused {reused} tokens, first prompts' full blocks {blocks}"
    );
    assert!(reused > 0, "the follow-ups reuse their first turns' blocks");
    assert!(
        reused >= blocks,
        "every follow-up reuses at least its first prompt's full blocks"
    );
}

/// Prompts whose answers repeat what they read (so that prompt-lookup drafts are often right).
const REPEATS: [&str; 5] = [
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.",
    "Count from 1 to 20, separated by commas.",
    "Copy this list exactly: apples, pears, plums, apples, pears, plums, apples, pears.",
    "Write the word 'hello' ten times.",
    "What is the capital of France?",
];

/// Steps `engine` to the end; after every step each live request's page table holds exactly the
/// pages of the positions it computed (so a rejected draft's positions were rewound).
fn run_checking_extent(engine: &mut Engine<'_>, ids: &[u64]) -> Vec<Completion> {
    let mut done = Vec::new();
    while !engine.is_empty() {
        done.extend(engine.step().unwrap());
        for &id in ids {
            if let Some(KvExtent { computed, pages }) = engine.kv_extent(id) {
                assert_eq!(
                    pages,
                    computed.div_ceil(TPB as usize),
                    "request {id}: {pages} pages for {computed} positions"
                );
            }
        }
        assert!(engine.stats().steps < 2000, "the loop drains");
    }
    done.sort_by_key(|c| c.id);
    done
}

/// Prompt-lookup drafts verified in one step of 1 + drafts rows per request: the kept drafts and
/// the token after them are exactly plain greedy decoding (the reference, a token at a time), some
/// drafts are kept and some rejected, and the rejected ones' KV positions are rewound. Run on a
/// roomy pool, and on one so small that requests are suspended to the host tier between drafts.
#[test]
fn speculative_decoding_with_prompt_lookup_drafts() {
    let Some(model) = common::model() else { return };
    let tok = model.tokenizer();
    let prompts: Vec<Vec<u32>> = REPEATS
        .iter()
        .map(|q| tok.encode_chat(&[Message::user(*q)], true).unwrap())
        .collect();
    for (what, gpu, host) in [("roomy", 128, 0), ("tight, host tier", 22, 96)] {
        let mut cfg = config(gpu, host);
        cfg.speculative = Some(PromptLookup::default());
        let mut engine = Engine::new(model, cfg).unwrap();
        let ids: Vec<u64> = prompts
            .iter()
            .map(|p| engine.submit(p, NEW, None, Sampler::greedy()).unwrap())
            .collect();
        let got = run_checking_extent(&mut engine, &ids);
        let s = engine.stats();
        summary(&format!("speculative ({what})"), prompts.len(), &s);
        eprintln!(
            "speculative ({what}): {} drafts proposed, {} accepted, {} rejected, {} suspensions",
            s.drafts_proposed, s.drafts_accepted, s.drafts_rejected, s.suspensions
        );
        assert_solo(model, &format!("speculative ({what})"), &prompts, &got);
        assert!(s.drafts_accepted > 0, "some drafts are kept");
        assert!(s.drafts_rejected > 0, "some drafts are rejected");
        assert!(
            s.tokens < s.model_steps * prompts.len() as u64 + s.drafts_accepted,
            "kept drafts save steps"
        );
        if host > 0 {
            assert!(s.suspensions > 0, "requests are suspended between drafts");
        }
    }
}

/// Runs `prompts` disaggregated: context-only requests prefilled on `pre`, whose KV pages are
/// exported, their sends ended, and submitted to `dec`, which receives them and decodes.
/// Completions of `dec`, in prompt order.
fn serve_disaggregated(
    pre: &mut Engine<'_>,
    dec: &mut Engine<'_>,
    prompts: &[Vec<u32>],
) -> Vec<Completion> {
    let mut order = Vec::new();
    let ids: Vec<u64> = prompts
        .iter()
        .map(|p| pre.submit_context_only(p, None, Sampler::greedy()).unwrap())
        .collect();
    let mut done = Vec::new();
    while !(pre.is_empty() && dec.is_empty()) {
        if !pre.is_empty() {
            assert!(
                pre.step().unwrap().is_empty(),
                "nothing completes on the prefill side"
            );
        }
        for id in pre.sends() {
            let kv = pre.export_kv(id).unwrap();
            pre.end_send(id, true).unwrap();
            assert!(pre.export_kv(id).is_err(), "a send ends once");
            let d = dec.submit_transferred(kv, NEW).unwrap();
            order.push((d, ids.iter().position(|&i| i == id).unwrap()));
        }
        if !dec.is_empty() {
            done.extend(dec.step().unwrap());
        }
        assert!(dec.stats().steps < 2000, "the loop drains");
    }
    order.sort_unstable();
    done.sort_by_key(|c| c.id);
    let mut by_prompt: Vec<Option<Completion>> = vec![None; prompts.len()];
    for ((d, i), c) in order.into_iter().zip(done) {
        assert_eq!(c.id, d);
        by_prompt[i] = Some(c);
    }
    by_prompt.into_iter().map(Option::unwrap).collect()
}

/// Disaggregated serving: a prefill engine computes each prompt's KV and first token, its pages are
/// copied into a decode engine's store through the transfer arrows (send: context-only, sending,
/// end_send; receive: DISAGG_GENERATION_INIT, start_receive, end_receive) and decoded there, with
/// and without prompt-lookup drafts on the decode side. Free pages hold NaN, so a page the copy
/// missed shows up as a wrong token; every request equals its solo run.
#[test]
fn disaggregated_prefill_and_decode_engines() {
    let Some(model) = common::model() else { return };
    let tok = model.tokenizer();
    let mut prompts: Vec<Vec<u32>> = CHATS
        .iter()
        .map(|(q, _)| tok.encode_chat(&[Message::user(*q)], true).unwrap())
        .collect();
    prompts.push(tok.encode_chat(&[Message::user(REPEATS[1])], true).unwrap());
    for speculative in [None, Some(PromptLookup::default())] {
        let what = if speculative.is_some() {
            "with drafts"
        } else {
            "plain"
        };
        let mut pre = Engine::new(model, config(64, 0)).unwrap();
        let mut cfg = config(96, 0);
        cfg.speculative = speculative;
        let mut dec = Engine::new(model, cfg).unwrap();
        let got = serve_disaggregated(&mut pre, &mut dec, &prompts);
        let (p, d) = (pre.stats(), dec.stats());
        summary(
            &format!("disaggregated prefill ({what})"),
            prompts.len(),
            &p,
        );
        summary(&format!("disaggregated decode ({what})"), prompts.len(), &d);
        eprintln!(
            "disaggregated ({what}): {} sent, {} received, {} decode-side prefill tokens, {} drafts \
             accepted, {} rejected",
            p.kv_sent, d.kv_received, d.prefill_tokens, d.drafts_accepted, d.drafts_rejected
        );
        assert_solo(model, &format!("disaggregated ({what})"), &prompts, &got);
        let n = prompts.len() as u64;
        assert_eq!(
            (p.kv_sent, d.kv_received),
            (n, n),
            "every prompt's KV moved"
        );
        assert_eq!(p.tokens, n, "the prefill side samples each first token");
        assert!(
            p.prefill_tokens > 0 && d.prefill_tokens == 0,
            "prompts are computed once"
        );
        if speculative.is_some() {
            assert!(d.drafts_accepted > 0, "drafts are kept on the decode side");
        }
        assert!(pre.end_send(u64::MAX, true).is_err(), "no such send");
        let short = KvTransfer {
            prompt: prompts[0].clone(),
            first: 0,
            logits: Vec::new(),
            sampler: Sampler::greedy(),
            adapter: None,
            tokens_per_block: TPB,
            pages: Vec::new(),
        };
        assert!(dec.submit_transferred(short, NEW).is_err(), "pages missing");
        assert!(dec.is_empty(), "a refused transfer queues nothing");
    }
}
