//! Gemma 3 270M (scripts/fetch-gemma3.sh): its configuration, its SentencePiece tokenizer and
//! Gemma's turn format, greedy generation, and the paged step bit-identical to the reference on
//! prompts longer than the sliding window, with local layers reading no page wholly before it.

mod common;

use std::time::Instant;

use kvsched_engine::{Message, Model, Reference, Tokenizer, GEMMA_TURNS};

fn model() -> Option<&'static Model> {
    common::gemma3()
}

#[test]
fn loads_with_gemma3s_configuration() {
    let Some(m) = model() else { return };
    let c = m.config();
    assert_eq!(c.architecture, "gemma3");
    let dims = (
        c.blocks,
        c.embedding,
        c.heads,
        c.kv_heads,
        c.head_dim,
        c.feed_forward,
    );
    assert_eq!(dims, (18, 640, 4, 1, 256, 2048));
    assert_eq!((c.q_dim(), c.kv_dim(), c.vocab), (1024, 256, 262_144));
    assert_eq!((c.context_length, c.rope_base), (32_768, 1_000_000.0));
    assert!(c.tied_embeddings);
    let g = c.gemma.as_ref().expect("Gemma's parameters");
    assert_eq!((g.sliding_window, g.global_every), (512, 6));
    assert_eq!(
        (g.local_rope_base, g.attention_scale, g.final_softcap),
        (10_000.0, 0.0625, None)
    );
    let global: Vec<usize> = (0..c.blocks).filter(|&l| c.window(l).is_none()).collect();
    assert_eq!(global, [5, 11, 17]);
    assert_eq!(
        (
            c.window_start(0, 511),
            c.window_start(0, 512),
            c.window_start(5, 900)
        ),
        (0, 1, 0)
    );
    let t = m.tokenizer();
    assert_eq!((t.bos(), t.eos(), t.adds_bos()), (Some(2), 1, true));
    assert!(t.is_stop(1) && t.is_stop(106) && !t.is_stop(2));
    assert_eq!(t.token(106), Some("<end_of_turn>"));
}

/// Greedy generation through the reference: the prompt's tokens, the text, and the decode speed.
fn generate(m: &Model, prompt: &[u32], max_new: usize) -> (Vec<u32>, String, f64) {
    let mut r = Reference::new(m, prompt.len() + max_new, None);
    let mut logits = r.feed(prompt).unwrap();
    let mut out = Vec::new();
    let start = Instant::now();
    loop {
        let next = kvsched_engine::argmax(&logits);
        out.push(next);
        if out.len() == max_new || m.tokenizer().is_stop(next) {
            break;
        }
        logits = r.feed(&[next]).unwrap();
    }
    let speed = (out.len() - 1) as f64 / start.elapsed().as_secs_f64();
    (out.clone(), m.tokenizer().decode(&out).unwrap(), speed)
}

/// The base model (not instruction-tuned) answers a question in a few-shot prompt, and completes
/// a sentence.
#[test]
fn answers_paris_and_completes_sentences() {
    let Some(m) = model() else { return };
    let t = m.tokenizer();
    let prompt = t
        .encode("Q: What is the capital of Italy?\nA: Rome\nQ: What is the capital of France?\nA:")
        .unwrap();
    assert_eq!(prompt[0], 2, "BOS first: {prompt:?}");
    let (_, text, speed) = generate(m, &prompt, 12);
    println!("few-shot: {text:?} ({speed:.1} tok/s decode, 1 thread)");
    assert!(text.starts_with(" Paris"), "{text:?}");
    let prompt = t
        .encode("The Eiffel Tower is located in the city of")
        .unwrap();
    let (_, text, _) = generate(m, &prompt, 12);
    println!("completion: {text:?}");
    assert!(text.starts_with(" Paris"), "{text:?}");
}

/// Gemma 3 270M's tokenizer with Gemma's turn format given by hand (its GGUF file has none).
fn turns() -> Option<Tokenizer> {
    let mut t = Tokenizer::load(common::gemma3_path()?).expect("the tokenizer loads");
    t.set_chat_template(GEMMA_TURNS);
    Some(t)
}

/// The file has no chat template, and none is invented for it (issue 43: chat on a base model
/// printed junk in a made-up turn format): chat is refused, saying how to give one.
#[test]
fn a_file_without_a_chat_template_refuses_chat() {
    let Some(m) = model() else { return };
    assert!(m.tokenizer().chat_template().is_none());
    let e = m
        .tokenizer()
        .encode_chat(&[Message::user("Hi")], true)
        .expect_err("no template");
    assert!(e.to_string().contains("no chat template"), "{e}");
    assert!(e.to_string().contains("--chat-template"), "{e}");
}

#[test]
fn answers_a_chat_prompt_in_english() {
    let Some(m) = model() else { return };
    let t = &turns().expect("the model is there");
    let prompt = t
        .encode_chat(&[Message::user("What is the capital of France?")], true)
        .unwrap();
    assert_eq!(
        prompt.iter().filter(|&&i| i == 2).count(),
        1,
        "one BOS: {prompt:?}"
    );
    let (ids, text, speed) = generate(m, &prompt, 32);
    println!("chat: {text:?} ({} tokens, {speed:.1} tok/s)", ids.len());
    let letters = text.chars().filter(char::is_ascii_alphabetic).count();
    assert!(
        letters * 2 > text.chars().count(),
        "mostly letters: {text:?}"
    );
    let words = text.split_whitespace().count();
    assert!(words >= 3, "a few words: {text:?}");
}

/// The file's pieces, scores and types, read with candle's GGUF parser (not the engine's).
fn pieces() -> Option<(Vec<String>, Vec<f32>, Vec<i32>)> {
    use candle_core::quantized::gguf_file::{Content, Value};
    let path = common::gemma3_path()?;
    let content = Content::read(&mut std::fs::File::open(path).unwrap()).unwrap();
    let array = |key: &str| match &content.metadata[key] {
        Value::Array(values) => values.clone(),
        other => panic!("{key} is {other:?}"),
    };
    let tokens = array("tokenizer.ggml.tokens")
        .iter()
        .map(|v| v.to_string().unwrap().clone())
        .collect();
    let scores = array("tokenizer.ggml.scores")
        .iter()
        .map(|v| v.to_f32().unwrap())
        .collect();
    let types = array("tokenizer.ggml.token_type")
        .iter()
        .map(|v| v.to_i32().unwrap())
        .collect();
    Some((tokens, scores, types))
}

/// SentencePiece's BPE written plainly: start from the characters (spaces as `▁`), merge the
/// adjacent pair whose joined text is the highest-scored normal piece (the leftmost of equals)
/// until none is, then spell each symbol outside the vocabulary as its bytes.
fn naive_sentencepiece(text: &str, tokens: &[String], scores: &[f32], types: &[i32]) -> Vec<u32> {
    let id: std::collections::HashMap<&str, u32> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i as u32))
        .collect();
    let normal = |s: &str| id.get(s).copied().filter(|&i| types[i as usize] == 1);
    let text = text.replace(' ', "\u{2581}");
    let mut symbols: Vec<String> = text.chars().map(String::from).collect();
    loop {
        let mut best: Option<(usize, f32)> = None;
        for i in 0..symbols.len().saturating_sub(1) {
            if let Some(t) = normal(&format!("{}{}", symbols[i], symbols[i + 1])) {
                if best.is_none_or(|(_, s)| scores[t as usize] > s) {
                    best = Some((i, scores[t as usize]));
                }
            }
        }
        let Some((i, _)) = best else { break };
        let right = symbols.remove(i + 1);
        symbols[i].push_str(&right);
    }
    let mut ids = Vec::new();
    for s in &symbols {
        match id.get(s.as_str()) {
            Some(&i) => ids.push(i),
            None => ids.extend(s.bytes().map(|b| id[format!("<0x{b:02X}>").as_str()])),
        }
    }
    ids
}

#[test]
fn tokenizes_as_sentencepiece_merges_by_score() {
    let Some(m) = model() else { return };
    let Some((tokens, scores, types)) = pieces() else {
        return;
    };
    let t = m.tokenizer();
    for text in [
        "Hello, world! It's 2024-06-01 and π ≈ 3.14159; 1234567890 items.",
        "The quick brown fox jumps over the lazy dog.",
        "naïve café, Ünïcödé, 日本語のテキスト, 🙂🚀 emoji, ﬁ ligature",
        " leading space, trailing space ",
        "unbelievably antidisestablishmentarianism Pneumonoultramicroscopic",
        "\u{1F9EC}\u{1F9EC} rare emoji and \u{0BF5} a Tamil sign",
    ] {
        let want = naive_sentencepiece(text, &tokens, &scores, &types);
        assert_eq!(t.encode_text(text).unwrap(), want, "{text:?}");
    }
}

#[test]
fn round_trips_text_exactly_and_puts_bos_in_front() {
    let Some(m) = model() else { return };
    let t = m.tokenizer();
    let texts = [
        "system",
        " leading space, trailing space ",
        "Hello, world! It's 2024-06-01 and π ≈ 3.14159; 1234567890 items.",
        "fn main() {\n    println!(\"{}\", 42_u32.pow(2));\n}\n\n\t\ttabs\r\nCRLF",
        "naïve café, Ünïcödé, Ελληνικά, русский, 日本語のテキスト, 中文，한국어",
        "🙂🚀 emoji, 👩‍👩‍👧 a family, 🇫🇷 a flag, ﬁ ligature, \u{200b}zero width",
        "<start_of_turn>user\nspecial tokens inside text<end_of_turn>\n<eos>",
        "   multiple   spaces\n\n\nand newlines   ",
        "",
    ];
    for text in texts {
        let ids = t.encode_text(text).unwrap();
        assert_eq!(
            t.decode(&ids).unwrap(),
            text,
            "round trip of {text:?} ({ids:?})"
        );
        let with_bos = t.encode(text).unwrap();
        assert_eq!((with_bos[0], &with_bos[1..]), (2, ids.as_slice()));
    }
    let special = t
        .encode_text("<start_of_turn>model\n<end_of_turn>")
        .unwrap();
    assert_eq!(special, [105, t.token_id("model").unwrap(), 107, 106]);
}

#[test]
fn renders_gemmas_turns() {
    let Some(t) = turns() else { return };
    let t = &t;
    let messages = [
        Message::system("Be brief."),
        Message::user("Hi!"),
        Message::new("assistant", "Hello."),
        Message::user("What is 2 + 2?"),
    ];
    let text = t.render_chat(&messages, true).unwrap();
    let want = "<bos><start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n<start_of_turn>model\n\
                Hello.<end_of_turn>\n<start_of_turn>user\nWhat is 2 + 2?<end_of_turn>\n\
                <start_of_turn>model\n";
    assert_eq!(text, want);
    let plain = t.render_chat(&[Message::user("Hi!")], false).unwrap();
    assert_eq!(plain, "<bos><start_of_turn>user\nHi!<end_of_turn>\n");
    let ids = t.encode_chat(&messages, true).unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 1, "{ids:?}");
    assert_eq!(t.decode(&ids).unwrap(), want);
}

/// New tokens each identity test generates.
const NEW: usize = 8;
const TPB: usize = 16;

/// The two long prompts (974 and 651 tokens, the window 512) and their reference outcomes, once per
/// test binary.
fn long_cases(m: &Model) -> &'static [(Vec<u32>, common::Outcome); 2] {
    static CASES: std::sync::OnceLock<[(Vec<u32>, common::Outcome); 2]> =
        std::sync::OnceLock::new();
    CASES.get_or_init(|| {
        [(900, 5), (600, 9)].map(|(words, seed)| {
            let prompt = common::long_prompt(m, words, seed);
            let start = Instant::now();
            let want = common::reference(m, &prompt, NEW, None);
            println!(
                "reference: {} prompt tokens + {NEW} in {:.1} s",
                prompt.len(),
                start.elapsed().as_secs_f64()
            );
            (prompt, want)
        })
    })
}

fn request(prompt: &[u32], chunk: usize, arrive: usize) -> common::Request {
    common::Request {
        prompt: prompt.to_vec(),
        chunk,
        arrive,
        max_new: NEW,
        adapter: None,
    }
}

#[test]
fn the_whole_long_prompt_in_one_step_equals_the_reference() {
    let Some(m) = model() else { return };
    let [(prompt, want), _] = long_cases(m);
    assert!(prompt.len() > 900, "{} tokens", prompt.len());
    let got = common::run_paged(m, &[request(prompt, usize::MAX, 0)], TPB, 80, 3, None);
    common::assert_identical("whole prompt", &got[0], want);
}

/// Chunks of 100 and of 512 across the window's edge, two sequences in a batch at different
/// positions, shuffled pages that start as NaN.
#[test]
fn chunked_and_batched_long_prompts_equal_the_reference() {
    let Some(m) = model() else { return };
    let [(a, want_a), (b, want_b)] = long_cases(m);
    let requests = [request(a, 100, 0), request(b, 512, 2)];
    let pages = (layout_pages(a) + layout_pages(b) + 4) as u32;
    let got = common::run_paged(m, &requests, TPB, pages, 17, None);
    common::assert_identical("chunks of 100", &got[0], want_a);
    common::assert_identical("chunks of 512, batched", &got[1], want_b);
}

fn layout_pages(prompt: &[u32]) -> usize {
    (prompt.len() + NEW).div_ceil(TPB)
}

/// How a windowed run frees what the local layers no longer see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Release {
    /// One table for every layer: after each step, the local layers' pieces of the pages wholly
    /// before the next step's window are overwritten with NaN (the global layers still read them).
    LocalPieces,
    /// The local layers have a table of their own: after each step, its pages wholly before the
    /// next step's window are filled with NaN, handed back to the free list (and given out again)
    /// and their entries set to `Sequence::RELEASED`.
    LocalTable,
}

/// One request run in chunks of `chunk`, releasing what its local layers no longer see after
/// every step.
fn run_windowed(m: &Model, prompt: &[u32], chunk: usize, release: Release) -> common::Outcome {
    use kvsched_engine::{Batch, BlockTableShape, HostKvStore, PageStore, Sequence, Tier};
    let layout = m.kv_layout(TPB);
    let window = m.config().gemma.as_ref().unwrap().sliding_window;
    let gpu_pages = 2 * layout_pages(prompt) as u32;
    let mut kv = HostKvStore::new(
        layout.pool_shape(gpu_pages, 0),
        BlockTableShape::new(1, gpu_pages),
    )
    .unwrap();
    let nan: Vec<u8> = f32::NAN.to_le_bytes().repeat(layout.page_bytes() / 4);
    for p in 0..gpu_pages {
        kv.write_page(Tier::Gpu, p, &nan).unwrap();
    }
    let mut free: Vec<u32> = (0..gpu_pages).collect();
    common::Rng(29).shuffle(&mut free);
    let (mut pages, mut locals) = (Vec::new(), Vec::new());
    let mut out = common::Outcome {
        tokens: Vec::new(),
        logits: Vec::new(),
    };
    let mut pos = 0;
    while out.tokens.len() < NEW {
        let input = if pos < prompt.len() {
            prompt[pos..prompt.len().min(pos + chunk)].to_vec()
        } else {
            vec![*out.tokens.last().unwrap()]
        };
        while pages.len() < layout.pages_for(pos + input.len()) {
            pages.push(free.pop().unwrap());
            if release == Release::LocalTable {
                locals.push(free.pop().unwrap());
            }
        }
        let mut batch = Batch::new();
        batch.push(Sequence {
            tokens: &input,
            start: pos,
            pages: &pages,
            local_pages: (release == Release::LocalTable).then_some(locals.as_slice()),
            logits: pos + input.len() >= prompt.len(),
            adapter: None,
        });
        let logits = m.step(&batch, &mut kv, None).unwrap();
        pos += input.len();
        if let Some(row) = logits.get(0) {
            out.tokens.push(kvsched_engine::argmax(row));
            out.logits.push(row.to_vec());
        }
        // Entries wholly before the next step's window: no local layer reads them again.
        let before = (pos + 1).saturating_sub(window) / TPB;
        let tables = (pages.as_slice(), locals.as_mut_slice());
        release_before(m, &mut kv, release, tables, before, &mut free);
    }
    out
}

/// A local layer reads no page wholly before its window: overwriting those pages' local pieces
/// with NaN after every step (prefill in chunks of 100 and 512, then decode) changes nothing.
#[test]
fn local_layers_read_no_page_before_their_window() {
    let Some(m) = model() else { return };
    let [(a, want_a), (b, want_b)] = long_cases(m);
    let got = run_windowed(m, a, 100, Release::LocalPieces);
    common::assert_identical("NaN before the window, chunks of 100", &got, want_a);
    let got = run_windowed(m, b, 512, Release::LocalPieces);
    common::assert_identical("NaN before the window, chunks of 512", &got, want_b);
}

/// The local layers on a table of their own whose pages before the window are released (NaN,
/// given out again for later positions, entries `RELEASED`): the same logits and tokens.
#[test]
fn a_local_table_with_released_entries_equals_the_reference() {
    let Some(m) = model() else { return };
    let [(a, want_a), _] = long_cases(m);
    let got = run_windowed(m, a, 100, Release::LocalTable);
    common::assert_identical("a local table with released pages", &got, want_a);
}

/// Releases, as `release` says, what the local layers see of table entries `0..before`.
fn release_before(
    m: &Model,
    kv: &mut kvsched_engine::HostKvStore,
    release: Release,
    (pages, locals): (&[u32], &mut [u32]),
    before: usize,
    free: &mut Vec<u32>,
) {
    use kvsched_engine::{PageStore, Sequence, Tier};
    let layout = m.kv_layout(TPB);
    let nan: Vec<u8> = f32::NAN.to_le_bytes().repeat(layout.page_bytes() / 4);
    let mut page = vec![0u8; layout.page_bytes()];
    for e in 0..before {
        match release {
            Release::LocalPieces => {
                kv.read_page(Tier::Gpu, pages[e], &mut page).unwrap();
                for l in (0..layout.layers).filter(|&l| m.config().window(l).is_some()) {
                    let piece = l * layout.piece_bytes()..(l + 1) * layout.piece_bytes();
                    page[piece.clone()].copy_from_slice(&nan[piece]);
                }
                kv.write_page(Tier::Gpu, pages[e], &page).unwrap();
            }
            Release::LocalTable if locals[e] != Sequence::RELEASED => {
                kv.write_page(Tier::Gpu, locals[e], &nan).unwrap();
                free.push(locals[e]);
                locals[e] = Sequence::RELEASED;
            }
            Release::LocalTable => {}
        }
    }
}

/// A local table is checked from the window of the chunk's first token on, and only there.
#[test]
fn a_local_table_is_checked_from_its_window_on() {
    use kvsched_engine::{Batch, BlockTableShape, HostKvStore, Sequence};
    let Some(m) = model() else { return };
    let layout = m.kv_layout(TPB);
    let mut kv = HostKvStore::new(layout.pool_shape(80, 0), BlockTableShape::new(1, 80)).unwrap();
    let pages: Vec<u32> = (0..40).collect();
    let r = Sequence::RELEASED;
    // Position 600 sees 89..=600: entries 0..5 (positions 0..80) are before its window, 5 is in
    // it; 601 positions use 38 entries.
    let released: Vec<u32> = [r; 5].into_iter().chain(40..75).collect();
    let in_window: Vec<u32> = [r; 6].into_iter().chain(40..74).collect();
    let shared: Vec<u32> = [r; 5].into_iter().chain(37..72).collect();
    let short: Vec<u32> = [r; 5].into_iter().chain(40..70).collect();
    let token = [7u32];
    for (local, says) in [
        (&in_window, Some("outside the 80 GPU pages")),
        (&shared, Some("page 37 appears twice")),
        (&short, Some("the local table has 35")),
        (&released, None),
    ] {
        let mut batch = Batch::new();
        batch.push(Sequence {
            tokens: &token,
            start: 600,
            pages: &pages,
            local_pages: Some(local),
            logits: true,
            adapter: None,
        });
        match (m.step(&batch, &mut kv, None), says) {
            (Err(e), Some(says)) => {
                assert!(e.to_string().contains(says), "{e} (expected {says:?})");
            }
            (Ok(_), None) => {}
            (got, _) => panic!("{says:?}: {got:?}"),
        }
    }
}
