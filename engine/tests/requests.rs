//! What a request asks of the engine beyond its prompt: a sampler that a stop token does not end
//! (a trace replay's requests generate exactly their output lengths), and the count of tokens
//! generated so far, which a replay reads to time each request's first token.

mod common;

use kvsched_engine::{Engine, EngineConfig, Finish, Message, Sampler};

#[test]
fn a_request_ignoring_stop_runs_to_its_length_past_the_stop_token() {
    let Some(model) = common::model() else { return };
    let prompt = model
        .tokenizer()
        .encode_chat(&[Message::user("What is the capital of France?")], true)
        .unwrap();
    let mut engine = Engine::new(model, EngineConfig::default()).unwrap();
    let stops = engine.submit(&prompt, 64, None, Sampler::greedy()).unwrap();
    let runs_on = engine
        .submit(&prompt, 64, None, Sampler::greedy().ignoring_stop())
        .unwrap();
    let mut seen = [0usize; 2];
    let mut done = Vec::new();
    while !engine.is_empty() {
        done.extend(engine.step().unwrap());
        for (k, id) in [stops, runs_on].into_iter().enumerate() {
            if let Some(n) = engine.generated(id) {
                assert!(n >= seen[k], "the generated count only grows");
                seen[k] = n;
            }
        }
    }
    done.sort_by_key(|c| c.id);
    let (a, b) = (&done[0], &done[1]);
    assert_eq!(
        a.finish,
        Finish::Stop,
        "the short answer ends on its stop token"
    );
    assert!(a.tokens.len() < 64, "{} tokens", a.tokens.len());
    assert_eq!(b.finish, Finish::Length);
    assert_eq!(b.tokens.len(), 64);
    assert_eq!(
        b.tokens[..a.tokens.len()],
        a.tokens[..],
        "the same greedy run up to the stop"
    );
    assert!(seen[1] >= 1 && engine.generated(runs_on).is_none());
}

/// A prompt longer than one step's token budget is prefilled in chunks by the default configuration
/// (the scheduler's own default takes whole prompts only up to 1,024 tokens, so a longer one was
/// never scheduled and the loop reported a stall).
#[test]
fn the_default_engine_serves_a_prompt_longer_than_a_step() {
    let Some(model) = common::model() else { return };
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(120);
    let prompt = model.tokenizer().encode(&text).unwrap();
    assert!(prompt.len() > 1024, "{} tokens", prompt.len());
    let mut engine = Engine::new(model, EngineConfig::default()).unwrap();
    engine.submit(&prompt, 2, None, Sampler::greedy()).unwrap();
    let done = engine.run().expect("served, not stalled");
    assert_eq!(done[0].tokens.len(), 2);
    assert!(engine.stats().context_chunks > 1, "prefilled in chunks");
}
