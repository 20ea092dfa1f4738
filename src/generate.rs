//! `kvsched generate`: a real model served by the real scheduler. Every prompt is a user message
//! through the model's chat template; all of them are submitted to one `kvsched-engine` [`Engine`]
//! and served batched; each completion is printed in submission order, then one line of figures.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use kvsched_engine::{
    Engine, EngineConfig, EngineStats, Lora, Message, Model, Sampler, MAX_ADAPTERS, MAX_REQUESTS,
};

/// Positions a KV page holds.
const TOKENS_PER_BLOCK: u32 = 16;
/// Pages one request's table holds (with [`TOKENS_PER_BLOCK`], the longest request).
const MAX_BLOCKS: u32 = 128;
/// GPU-tier KV pages.
const GPU_PAGES: u32 = 256;

/// `kvsched generate`'s options.
#[derive(Debug, clap::Parser)]
#[command(
    name = "kvsched generate",
    about = "Serves chat prompts with a GGUF llama model on the CPU, batched on the real scheduler.",
    long_about = "Serves chat prompts with a GGUF llama model on the CPU (kvsched-engine), batched on the \
        real scheduler with a prefix cache. Prints each completion in submission order, then one line of \
        figures: requests, generated tokens, tokens/s (over the serving loop, model load excluded), steps, \
        suspensions (evictions), prefix-hit tokens, adapter loads, the scheduler's share of step time \
        (schedule, ensure_batch, take_moves and complete_step against the whole step) and the mean time \
        a step spent preparing its batch (rows and page tables). Greedy sampling."
)]
struct GenerateArgs {
    /// The GGUF model file (scripts/fetch-model.sh fetches the test model and prints its path).
    #[arg(long, value_name = "FILE")]
    model: PathBuf,
    /// Registers a seeded random rank-8 LoRA adapter on q, k, v and o (repeatable, at most 8). With
    /// adapters, prompt i runs on adapter i mod N (round-robin in prompt order).
    #[arg(long = "adapter", value_name = "SEED")]
    adapters: Vec<u64>,
    /// candle's CPU threads (its pool busy-waits: on contended cores 1 is fastest).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    threads: u16,
    /// Tokens each request generates at most (it also stops at the model's stop token).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    max_new_tokens: u32,
    /// A system message before every prompt (else the template's default).
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// A file of prompts, one per non-blank line, after those on the command line.
    #[arg(long, value_name = "FILE")]
    prompts_file: Option<PathBuf>,
    /// A Jinja chat template to render the prompts through, instead of the model file's (a file
    /// without one refuses chat: give one, or --raw).
    #[arg(long, value_name = "FILE", conflicts_with = "raw")]
    chat_template: Option<PathBuf>,
    /// The prompts as they are, no chat template (a base model's continuation).
    #[arg(long)]
    raw: bool,
    /// Rebuild the step's batch from the scheduler's full lists every step instead of applying its
    /// batch delta to the engine's persistent batch (the peer the batch preparation figure is
    /// compared with).
    #[arg(long)]
    rebuild_batch: bool,
    /// The prompts (user messages).
    #[arg(value_name = "PROMPT")]
    prompts: Vec<String>,
}

/// `kvsched generate`: see `kvsched generate --help`.
pub fn cli(args: &[String]) -> ExitCode {
    let a: GenerateArgs = match crate::args::parse("kvsched generate", args) {
        Ok(a) => a,
        Err(e) => return crate::args::exit(&e),
    };
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure { message, code }) => {
            eprintln!("kvsched generate: {message}");
            ExitCode::from(code)
        }
    }
}

/// Why `generate` stopped: a one-line message and the exit status (2: bad input, 1: the run failed).
struct Failure {
    message: String,
    code: u8,
}

fn bad(message: impl Into<String>) -> Failure {
    Failure {
        message: message.into(),
        code: 2,
    }
}

fn failed(e: &kvsched_engine::EngineError) -> Failure {
    Failure {
        message: e.to_string(),
        code: 1,
    }
}

fn run(a: &GenerateArgs) -> Result<(), Failure> {
    let texts = prompts(a)?;
    if a.adapters.len() > MAX_ADAPTERS {
        return Err(bad(format!(
            "{} adapters given; the engine registers at most {MAX_ADAPTERS}",
            a.adapters.len()
        )));
    }
    kvsched_engine::init_threads(usize::from(a.threads));
    let mut model = Model::load(&a.model).map_err(|e| bad(e.to_string()))?;
    if let Some(path) = &a.chat_template {
        let t = std::fs::read_to_string(path)
            .map_err(|e| bad(format!("--chat-template {}: {e}", path.display())))?;
        model.set_chat_template(t);
    }
    if !a.raw && model.tokenizer().chat_template().is_none() {
        return Err(bad(format!(
            "{} has no chat template (no tokenizer.chat_template): give one with --chat-template FILE, \
             or --raw for the prompts as they are",
            a.model.display()
        )));
    }
    let requests = encode(&model, a, &texts)?;
    let config = EngineConfig {
        tokens_per_block: TOKENS_PER_BLOCK,
        gpu_pages: GPU_PAGES,
        max_blocks: MAX_BLOCKS,
        prefix_cache: true,
        rebuild_batch: a.rebuild_batch,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(&model, config).map_err(|e| failed(&e))?;
    for &seed in &a.adapters {
        let lora = Lora::seeded(model.config(), 8, 16.0, 0.1, seed);
        engine
            .register_adapter(seed, &lora)
            .map_err(|e| bad(format!("--adapter {seed}: {e}")))?;
    }
    let started = Instant::now();
    let completions = serve(&mut engine, a, &requests)?;
    let secs = started.elapsed().as_secs_f64();
    let tok = model.tokenizer();
    for (i, (text, tokens)) in texts.iter().zip(&completions).enumerate() {
        let body: Vec<u32> = tokens
            .iter()
            .copied()
            .filter(|&t| !tok.is_stop(t))
            .collect();
        let out = tok.decode(&body).map_err(|e| failed(&e))?;
        println!("--- {}: {text}\n{}", i + 1, out.trim());
    }
    println!("{}", figures(&engine.stats(), requests.len(), secs));
    Ok(())
}

/// The prompts of the command line, then those of `--prompts-file`; an empty one is refused.
fn prompts(a: &GenerateArgs) -> Result<Vec<String>, Failure> {
    let mut all = a.prompts.clone();
    if let Some(path) = &a.prompts_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            bad(format!(
                "{}: cannot read the prompts file: {e}",
                path.display()
            ))
        })?;
        all.extend(
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(str::to_string),
        );
    }
    if all.is_empty() {
        return Err(bad("no prompt given (PROMPT… or --prompts-file FILE)"));
    }
    if let Some(i) = all.iter().position(|p| p.trim().is_empty()) {
        return Err(bad(format!("prompt {} is empty", i + 1)));
    }
    Ok(all)
}

/// Each prompt's chat tokens, checked against one request's limit before any work.
fn encode(model: &Model, a: &GenerateArgs, texts: &[String]) -> Result<Vec<Vec<u32>>, Failure> {
    let tok = model.tokenizer();
    let limit = model
        .config()
        .context_length
        .min((MAX_BLOCKS * TOKENS_PER_BLOCK) as usize);
    let max_new = a.max_new_tokens as usize;
    texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let ids = if a.raw {
                tok.encode(text).map_err(|e| failed(&e))?
            } else {
                let mut messages = Vec::with_capacity(2);
                if let Some(system) = &a.system {
                    messages.push(Message::system(system.clone()));
                }
                messages.push(Message::user(text.clone()));
                tok.encode_chat(&messages, true).map_err(|e| failed(&e))?
            };
            if ids.len() + max_new > limit {
                return Err(bad(format!(
                    "prompt {}: {} chat tokens + --max-new-tokens {max_new} exceed the limit of {limit} \
                     tokens a request may hold",
                    i + 1,
                    ids.len()
                )));
            }
            Ok(ids)
        })
        .collect()
}

/// Submits the requests (as many at a time as the engine holds, the next one as soon as a slot is
/// free) and steps until all finished; returns each one's generated tokens in submission order.
fn serve(
    engine: &mut Engine<'_>,
    a: &GenerateArgs,
    requests: &[Vec<u32>],
) -> Result<Vec<Vec<u32>>, Failure> {
    let mut ids = Vec::with_capacity(requests.len());
    let mut next = 0;
    let finished = engine.run_with(|engine| {
        while next < requests.len() && engine.len() < MAX_REQUESTS {
            let adapter = (!a.adapters.is_empty()).then(|| a.adapters[next % a.adapters.len()]);
            let new = a.max_new_tokens as usize;
            ids.push(engine.submit(&requests[next], new, adapter, Sampler::greedy())?);
            next += 1;
        }
        Ok(())
    });
    let mut done: std::collections::HashMap<u64, Vec<u32>> = match finished {
        Ok(all) => all.into_iter().map(|c| (c.id, c.tokens)).collect(),
        Err(e @ kvsched_engine::EngineError::Refused(_)) => {
            return Err(bad(format!("prompt {}: {e}", next + 1)))
        }
        Err(e) => return Err(failed(&e)),
    };
    Ok(ids
        .iter()
        .map(|id| done.remove(id).unwrap_or_default())
        .collect())
}

/// The figures line.
fn figures(s: &EngineStats, requests: usize, secs: f64) -> String {
    let share = 100.0 * s.scheduler_ns as f64 / s.step_ns.max(1) as f64;
    format!(
        "requests {requests}, generated tokens {}, {:.1} tok/s ({secs:.2} s), steps {}, \
         suspensions {} (evictions {}), prefix-hit tokens {}, adapter loads {}, \
         scheduler {share:.3} % of step time, batch preparation {:.2} µs a step",
        s.tokens,
        s.tokens as f64 / secs.max(1e-9),
        s.steps,
        s.suspensions,
        s.evictions,
        s.prefix_reused_tokens,
        s.adapter_loads,
        s.prep_ns as f64 / 1e3 / s.steps.max(1) as f64,
    )
}
