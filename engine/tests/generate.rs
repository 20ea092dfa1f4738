//! The model really runs: a chat question answered correctly, greedy, through the reference and
//! through the paged step.

mod common;

use kvsched_engine::{Batch, BlockTableShape, HostKvStore, Message, Reference, Sequence};

#[test]
fn the_capital_of_france_is_paris() {
    let Some(model) = common::model() else { return };
    let t = model.tokenizer();
    // With the template's default system prompt ("You are a helpful AI assistant named SmolLM")
    // this 135M model answers in French ("L'Étoile, la Cité, ..."): so does candle-transformers'
    // own quantized llama on the original Q4_1 weights. A plain system prompt gets the answer.
    let messages = [
        Message::system("You are a helpful assistant."),
        Message::user("What is the capital of France?"),
    ];
    let prompt = t.encode_chat(&messages, true).unwrap();
    let mut reference = Reference::new(model, 256, None);
    let answer = reference.generate(&prompt, 16).unwrap();
    let text = t.decode(&answer).unwrap();
    assert!(text.contains("Paris"), "the answer was {text:?}");

    // The same through the paged step: the prompt in one chunk, then one token a step.
    let layout = model.kv_layout(16);
    let mut kv = HostKvStore::new(layout.pool_shape(16, 0), BlockTableShape::new(1, 16)).unwrap();
    let pages: Vec<u32> = (0..16).rev().collect();
    let (mut tokens, mut start, mut out) = (prompt.clone(), 0, Vec::new());
    while out.len() < answer.len() {
        let mut batch = Batch::new();
        batch.push(Sequence {
            tokens: &tokens,
            start,
            pages: &pages,
            local_pages: None,
            logits: true,
            adapter: None,
        });
        let next = model
            .step(&batch, &mut kv, None)
            .unwrap()
            .argmax(0)
            .unwrap();
        start += tokens.len();
        tokens = vec![next];
        out.push(next);
    }
    assert_eq!(out, answer);
}

#[test]
fn the_hyper_parameters_come_from_the_metadata() {
    let Some(model) = common::model() else { return };
    let c = model.config();
    assert_eq!(c.architecture, "llama");
    assert_eq!(
        (
            c.blocks,
            c.embedding,
            c.feed_forward,
            c.heads,
            c.kv_heads,
            c.head_dim
        ),
        (30, 576, 1536, 9, 3, 64)
    );
    assert_eq!((c.rope_base, c.rms_eps), (100_000.0, 1e-5));
    assert_eq!(
        (c.context_length, c.vocab, c.tied_embeddings),
        (8192, 49_152, true)
    );
    let layout = model.kv_layout(16);
    assert_eq!(layout.bytes_per_token(), 2 * 30 * 192 * 4);
    assert_eq!(layout.pool_shape(4, 2).piece_bytes(), layout.piece_bytes());
}
