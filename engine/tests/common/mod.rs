//! What the engine's tests share: finding the model (skipped outside CI when absent), loading it
//! once per test binary on one candle thread, and a small synthetic GGUF writer.
#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

use kvsched_engine::Model;

/// The model's file name in the fetch script's cache folder.
const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Gemma 3 270M's file name in scripts/fetch-gemma3.sh's cache folder.
const GEMMA3_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// The test model: `KVSCHED_MODEL`, else the fetch script's cache path. When it is absent, a test
/// fails under CI (`CI` set) and is skipped otherwise, saying how to fetch it.
pub fn model_path() -> Option<PathBuf> {
    find_model("KVSCHED_MODEL", FILE, "scripts/fetch-model.sh")
}

/// Gemma 3 270M: `KVSCHED_GEMMA3`, else scripts/fetch-gemma3.sh's cache path; absent, a failure
/// under CI and a skip otherwise.
pub fn gemma3_path() -> Option<PathBuf> {
    find_model("KVSCHED_GEMMA3", GEMMA3_FILE, "scripts/fetch-gemma3.sh")
}

fn find_model(var: &str, file: &str, script: &str) -> Option<PathBuf> {
    let path = if let Some(p) = std::env::var_os(var) {
        PathBuf::from(p)
    } else {
        let cache = std::env::var_os("KVSCHED_MODEL_CACHE")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/kvsched/models"))
            })
            .unwrap_or_else(|| PathBuf::from(".cache/kvsched/models"));
        cache.join(file)
    };
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "the test model {} is missing (CI must run {script} first)",
        path.display()
    );
    // Straight to stderr, past the test harness's capture, so that a skip is seen.
    let _ = writeln!(std::io::stderr(), "skipped: run {script}");
    None
}

/// Gemma 3 270M, loaded once per test binary, with candle on one thread.
pub fn gemma3() -> Option<&'static Model> {
    static MODEL: OnceLock<Model> = OnceLock::new();
    let path = gemma3_path()?;
    kvsched_engine::init_threads(1);
    Some(MODEL.get_or_init(|| Model::load(&path).expect("Gemma 3 loads")))
}

/// The model, loaded once per test binary, with candle on one thread.
pub fn model() -> Option<&'static Model> {
    static MODEL: OnceLock<Model> = OnceLock::new();
    let path = model_path()?;
    kvsched_engine::init_threads(1);
    Some(MODEL.get_or_init(|| Model::load(&path).expect("the test model loads")))
}

use kvsched_engine::{
    Batch, BlockTableShape, HostAdapterStore, HostKvStore, Lora, PageStore, Reference, Sequence,
    Tier,
};

/// A small deterministic generator for shuffles and test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }

    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// What one request produced: its greedy tokens and the logits each was taken from.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub tokens: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
}

/// Asserts two outcomes identical, logits bit for bit.
pub fn assert_identical(what: &str, got: &Outcome, want: &Outcome) {
    assert_eq!(got.tokens, want.tokens, "{what}: tokens");
    assert_eq!(got.logits.len(), want.logits.len(), "{what}: logit rows");
    for (i, (g, w)) in got.logits.iter().zip(&want.logits).enumerate() {
        let same = g.len() == w.len() && g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{what}: logits of token {i} differ");
    }
}

/// Greedy until a stop token or `max_new` tokens (the rule both drivers follow).
fn done(model: &Model, out: &Outcome, max_new: usize) -> bool {
    out.tokens.len() == max_new
        || out
            .tokens
            .last()
            .is_some_and(|&t| model.tokenizer().is_stop(t))
}

/// The reference outcome of one request: the whole prompt in one pass, then a token at a time.
pub fn reference(model: &Model, prompt: &[u32], max_new: usize, lora: Option<Lora>) -> Outcome {
    let mut r = Reference::new(model, prompt.len() + max_new, lora);
    let mut out = Outcome {
        tokens: Vec::new(),
        logits: Vec::new(),
    };
    let mut logits = r.feed(prompt).unwrap();
    loop {
        let next = kvsched_engine::argmax(&logits);
        out.tokens.push(next);
        out.logits.push(logits);
        if done(model, &out, max_new) {
            return out;
        }
        logits = r.feed(&[next]).unwrap();
    }
}

/// One request of a paged run.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    /// Prefill tokens a step (the rest of the prompt when larger).
    pub chunk: usize,
    /// The step at which the request joins the batch.
    pub arrive: usize,
    pub max_new: usize,
    /// Its adapter's device pages in the adapter store.
    pub adapter: Option<Vec<u32>>,
}

/// A paged run: every arrived, unfinished request in each step's batch (its next prefill chunk or
/// its decode token); pages handed out on demand from a shuffled free list; a finished request's
/// pages filled with NaN and handed out again. Every GPU page starts as NaN.
pub fn run_paged(
    model: &Model,
    requests: &[Request],
    tokens_per_block: usize,
    gpu_pages: u32,
    seed: u64,
    adapters: Option<&HostAdapterStore>,
) -> Vec<Outcome> {
    let layout = model.kv_layout(tokens_per_block);
    let width = gpu_pages;
    let mut kv = HostKvStore::new(
        layout.pool_shape(gpu_pages, 0),
        BlockTableShape::new(requests.len() as u32, width),
    )
    .unwrap();
    let nan: Vec<u8> = f32::NAN.to_le_bytes().repeat(layout.page_bytes() / 4);
    for p in 0..gpu_pages {
        kv.write_page(Tier::Gpu, p, &nan).unwrap();
    }
    let mut rng = Rng(seed | 1);
    let mut free: Vec<u32> = (0..gpu_pages).collect();
    rng.shuffle(&mut free);
    let n = requests.len();
    let mut pos = vec![0usize; n];
    let mut tables: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut outs: Vec<Outcome> = vec![
        Outcome {
            tokens: Vec::new(),
            logits: Vec::new(),
        };
        n
    ];
    let mut finished = vec![false; n];
    let mut step = 0;
    while finished.iter().any(|f| !f) {
        let mut members = Vec::new();
        let mut inputs: Vec<Vec<u32>> = Vec::new();
        for (i, r) in requests.iter().enumerate() {
            if finished[i] || r.arrive > step {
                continue;
            }
            let input = if pos[i] < r.prompt.len() {
                let len = r.chunk.min(r.prompt.len() - pos[i]);
                r.prompt[pos[i]..pos[i] + len].to_vec()
            } else {
                vec![*outs[i].tokens.last().unwrap()]
            };
            while tables[i].len() < layout.pages_for(pos[i] + input.len()) {
                tables[i].push(free.pop().expect("the pool holds the run"));
            }
            members.push(i);
            inputs.push(input);
        }
        step += 1;
        if members.is_empty() {
            continue;
        }
        let mut batch = Batch::new();
        for (&i, input) in members.iter().zip(&inputs) {
            batch.push(Sequence {
                tokens: input,
                start: pos[i],
                pages: &tables[i],
                local_pages: None,
                logits: pos[i] + input.len() >= requests[i].prompt.len(),
                adapter: requests[i].adapter.as_deref(),
            });
        }
        let logits = model
            .step(&batch, &mut kv, adapters.map(|a| a as &dyn PageStore))
            .unwrap();
        for (b, (&i, input)) in members.iter().zip(&inputs).enumerate() {
            pos[i] += input.len();
            if let Some(row) = logits.get(b) {
                outs[i].tokens.push(kvsched_engine::argmax(row));
                outs[i].logits.push(row.to_vec());
                if done(model, &outs[i], requests[i].max_new) {
                    finished[i] = true;
                    for p in tables[i].drain(..) {
                        kv.write_page(Tier::Gpu, p, &nan).unwrap();
                        free.push(p);
                    }
                    rng.shuffle(&mut free);
                }
            }
        }
    }
    outs
}

/// Chat prompts of different lengths.
pub fn prompts(model: &Model) -> Vec<Vec<u32>> {
    use kvsched_engine::Message;
    let t = model.tokenizer();
    [
        vec![
            Message::system("You are a helpful assistant."),
            Message::user("What is the capital of France?"),
        ],
        vec![Message::user("Write a haiku about the sea.")],
        vec![
            Message::system("Answer in one sentence."),
            Message::user("Why is the sky blue? Explain it to a child who asks many questions."),
        ],
        vec![Message::user("List three prime numbers.")],
    ]
    .iter()
    .map(|m| t.encode_chat(m, true).unwrap())
    .collect()
}

/// A prompt of about `words` pseudo-random English words (BOS first), the same for a seed: the
/// long prompts of the Gemma 3 tests.
pub fn long_prompt(m: &Model, words: usize, seed: u64) -> Vec<u32> {
    const WORDS: [&str; 48] = [
        "the", "river", "of", "a", "quiet", "town", "runs", "past", "old", "mills", "and", "under",
        "stone", "bridges", "where", "children", "fish", "in", "summer", "while", "their",
        "parents", "talk", "about", "weather", "prices", "harvest", "music", "letters", "from",
        "cousins", "abroad", "every", "morning", "baker", "opens", "shop", "at", "six", "bread",
        "smells", "warm", "through", "narrow", "streets", "towards", "market", "square",
    ];
    let mut rng = Rng(seed);
    let mut text = String::from("Once upon a time");
    for i in 0..words {
        text.push(' ');
        text.push_str(WORDS[rng.below(WORDS.len())]);
        if i % 13 == 12 {
            text.push_str(if i % 3 == 0 { "." } else { "," });
        }
    }
    m.tokenizer().encode(&text).unwrap()
}
