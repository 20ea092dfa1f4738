//! `kvsched serve`'s command line: the flags, the model loaded, the server started, SIGTERM and
//! Ctrl-C turned into a graceful shutdown.

use std::io::Write as _;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use kvsched_engine::{Model, MAX_ADAPTERS, MAX_REQUESTS};

use crate::{ServeConfig, Server, StartError};

/// `kvsched serve`'s options.
#[derive(Debug, clap::Parser)]
#[command(
    name = "kvsched serve",
    about = "Serves a GGUF llama model over an OpenAI-compatible HTTP API, on the CPU engine and the real scheduler.",
    long_about = "Serves a GGUF llama model over an OpenAI-compatible HTTP API (POST /v1/completions, \
        POST /v1/chat/completions with stream: true as server-sent events, GET /v1/models, GET /health, \
        GET /metrics in the Prometheus format), on kvsched-engine and the real scheduler with a prefix cache. \
        Prints `kvsched serve: listening on http://ADDR` once ready. SIGTERM or Ctrl-C: new requests get \
        503, in-flight ones run on for --shutdown-timeout seconds and are then aborted; exit status 0."
)]
struct ServeArgs {
    /// The GGUF model file (scripts/fetch-model.sh fetches the test model and prints its path).
    #[arg(long, value_name = "FILE")]
    model: PathBuf,
    /// A LoRA adapter, a Hugging Face PEFT directory (adapter_config.json and
    /// adapter_model.safetensors), served as model NAME (repeatable, at most 8).
    #[arg(long = "adapter", value_name = "NAME=PATH", value_parser = named_path)]
    adapters: Vec<(String, PathBuf)>,
    /// The base model's name in the API (default: the model file's name without .gguf).
    #[arg(long, value_name = "NAME")]
    served_model_name: Option<String>,
    /// The address to listen on: an IP address or a host name (`localhost`), resolved once at start.
    #[arg(long, default_value = "127.0.0.1", value_parser = host_address)]
    host: IpAddr,
    /// The port (0: any free port; the line printed once ready says which).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Requests that may wait for the engine (beyond the ones it holds); past it, 429.
    #[arg(long, value_name = "N", default_value_t = 64)]
    max_queue: usize,
    /// A Jinja chat template for /v1/chat/completions instead of the model file's (a file without
    /// one refuses chat with a 400; `engine/templates/gemma-turns.jinja` is Gemma's turn format).
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// Serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter: adapters loaded from a path on
    /// this machine while the server runs (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING). Off by default.
    #[arg(long)]
    allow_runtime_lora: bool,
    /// The largest request body taken, bytes; past it, 413 (a prompt too long for --max-model-len
    /// is refused by its length before it is tokenized, whatever this says).
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 20)]
    max_body_bytes: usize,
    /// The key clients must send (`Authorization: Bearer KEY`) on every route but /health and
    /// /metrics; else 401. Default: `$KVSCHED_API_KEY`, else none.
    #[arg(
        long,
        value_name = "KEY",
        env = "KVSCHED_API_KEY",
        hide_env_values = true
    )]
    api_key: Option<String>,
    /// Origins a browser page may call the server from (CORS), comma-separated; `*` for any.
    /// Default: none.
    #[arg(long, value_name = "ORIGINS", value_delimiter = ',')]
    allowed_origins: Vec<String>,
    /// Seconds in-flight requests may run on after SIGTERM before they are aborted.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    shutdown_timeout: f64,
    /// Requests the engine runs at once (at most 256: the engine's table).
    #[arg(long, value_name = "N", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=MAX_REQUESTS as i64))]
    max_num_seqs: u32,
    /// The longest request, prompt and completion, in tokens.
    #[arg(long, value_name = "TOKENS", default_value_t = 2048)]
    max_model_len: u32,
    /// Tokens one step computes at most (a prompt is prefilled in chunks within it).
    #[arg(long, value_name = "N", default_value_t = 512)]
    max_num_batched_tokens: u32,
    /// The order requests are admitted in (vLLM's flag): `fcfs`, or `priority` (by the request's
    /// `priority` field, the lower first; a higher priority makes running lower ones yield).
    #[arg(long, value_name = "POLICY", default_value = "fcfs", value_parser = ["fcfs", "priority"])]
    scheduling_policy: String,
    /// Keep a running stream's steps under this many milliseconds while prompts are prefilled: chunks
    /// are sized by the CPU engine's fitted cost model (docs/ADMISSION.md). Off by default.
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    itl_target_ms: Option<u64>,
    /// A service class's share, `CLASS:requests=N,kv_tokens=N,adapter_pages=N` (class 0 to 3; each
    /// amount optional): while the class's requests wait within it, the classes above their shares
    /// give it back (docs/ADMISSION.md); unused, it is lent. Requests name their class in the
    /// `service_class` field. Repeat for each class.
    #[arg(long, value_name = "CLASS:SHARE", value_parser = class_share)]
    class_share: Vec<(u8, kvsched_core::config::Share)>,
    /// Positions a KV page holds.
    #[arg(long, value_name = "N", default_value_t = 16)]
    tokens_per_block: u32,
    /// GPU-tier KV pages (the pages attention reads; 46 KB a position for the test model).
    #[arg(long, value_name = "N", default_value_t = 512)]
    kv_pages: u32,
    /// Host-tier KV pages (suspended requests' KV); 0: recompute instead.
    #[arg(long, value_name = "N", default_value_t = 0)]
    kv_host_pages: u32,
    /// No prefix cache.
    #[arg(long)]
    no_prefix_cache: bool,
    /// Publish the prefix cache's KV events in vLLM's format on a ZMQ PUB socket bound here (e.g.
    /// tcp://127.0.0.1:5557), for a KV-aware router such as NVIDIA Dynamo's. Off by default.
    #[arg(long, value_name = "ENDPOINT")]
    kv_events: Option<String>,
    /// With --kv-events: a ROUTER socket bound here answers replay requests (a sequence number,
    /// 8 bytes big-endian) with the kept batches from it on.
    #[arg(long, value_name = "ENDPOINT", requires = "kv_events")]
    kv_events_replay: Option<String>,
    /// With --kv-events: the topic frame of every message.
    #[arg(long, value_name = "TOPIC", default_value = "", requires = "kv_events")]
    kv_events_topic: String,
    /// candle's CPU threads (its pool busy-waits: on contended cores 1 is fastest).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    threads: u16,
}

/// An IP address, or a host name resolved to its first address (IPv4 first, as `localhost` is
/// usually meant).
fn host_address(s: &str) -> Result<IpAddr, FlagValue> {
    if let Ok(ip) = s.parse() {
        return Ok(ip);
    }
    let resolved: Vec<SocketAddr> = (s, 0)
        .to_socket_addrs()
        .map_err(|e| FlagValue::Unresolved(s.to_string(), Some(e)))?
        .collect();
    let first = resolved.iter().find(|a| a.is_ipv4()).or(resolved.first());
    first
        .map(SocketAddr::ip)
        .ok_or_else(|| FlagValue::Unresolved(s.to_string(), None))
}

fn named_path(s: &str) -> Result<(String, PathBuf), FlagValue> {
    match s.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => {
            Ok((name.to_string(), PathBuf::from(path)))
        }
        _ => Err(FlagValue::NotNamedPath(s.to_string())),
    }
}

/// A flag's value that does not parse (clap prints it and exits 2).
#[derive(Debug)]
enum FlagValue {
    /// `--host`: neither an IP address nor a host name that resolves (the resolver's error, if any).
    Unresolved(String, Option<std::io::Error>),
    /// `--adapter`: not `NAME=PATH`.
    NotNamedPath(String),
}

impl std::fmt::Display for FlagValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unresolved(s, Some(e)) => write!(
                f,
                "{s:?} is neither an IP address nor a host name that resolves: {e}"
            ),
            Self::Unresolved(s, None) => write!(f, "host name {s:?} resolves to no address"),
            Self::NotNamedPath(s) => write!(f, "{s:?} is not NAME=PATH"),
        }
    }
}

impl std::error::Error for FlagValue {}

/// A flag that contradicts another or the model.
const fn flags(why: String) -> StartError {
    StartError::Flags(why)
}

impl ServeArgs {
    fn config(&self) -> Result<ServeConfig, StartError> {
        if self.adapters.len() > MAX_ADAPTERS {
            return Err(flags(format!(
                "{} adapters given; at most {MAX_ADAPTERS}",
                self.adapters.len()
            )));
        }
        if self.tokens_per_block == 0 || self.max_model_len < self.tokens_per_block {
            return Err(flags(
                "--max-model-len must be at least --tokens-per-block, which must be at least 1"
                    .into(),
            ));
        }
        let max_blocks = self.max_model_len.div_ceil(self.tokens_per_block);
        // A step holds every running request's decode and a page of prefill: with less, prefill
        // waits until the decodes end (prompts serialized behind them).
        let floor = self.max_num_seqs + self.tokens_per_block;
        if self.max_num_batched_tokens < floor {
            return Err(flags(format!(
                "--max-num-batched-tokens {} cannot hold a step of --max-num-seqs {} decodes and a page \
                 of prefill (--tokens-per-block {}): give at least {floor}",
                self.max_num_batched_tokens, self.max_num_seqs, self.tokens_per_block
            )));
        }
        if self.kv_pages < max_blocks {
            return Err(flags(format!(
                "--kv-pages {} cannot hold one request of --max-model-len {} ({max_blocks} pages)",
                self.kv_pages, self.max_model_len
            )));
        }
        if !(self.shutdown_timeout.is_finite() && self.shutdown_timeout >= 0.0) {
            return Err(flags(
                "--shutdown-timeout must be a number of seconds".into(),
            ));
        }
        let mut engine =
            ServeConfig::engine(self.max_model_len, self.tokens_per_block, self.kv_pages);
        engine.host_pages = self.kv_host_pages;
        engine.prefix_cache = !self.no_prefix_cache;
        engine.scheduler.max_num_requests = self.max_num_seqs;
        engine.scheduler.max_num_tokens = Some(self.max_num_batched_tokens);
        if self.scheduling_policy == "priority" {
            engine.scheduler.admission = kvsched_core::config::Admission::Priority;
        }
        if !self.class_share.is_empty() {
            let mut shares =
                [kvsched_core::config::Share::default(); kvsched_core::config::SERVICE_CLASSES];
            for &(class, share) in &self.class_share {
                shares[usize::from(class)] = share;
            }
            engine.scheduler.shares = Some(shares);
        }
        engine.scheduler.step_budget = self.itl_target_ms.map(|ms| kvsched_core::StepBudget {
            itl_us: ms * 1000,
            cost: kvsched_sim::cost::CostModel::cpu_smollm2_135m(self.tokens_per_block).step_cost(),
        });
        if self.kv_events.is_some() && self.no_prefix_cache {
            return Err(flags(
                "--kv-events needs the prefix cache (drop --no-prefix-cache)".into(),
            ));
        }
        let kv_events = self
            .kv_events
            .clone()
            .map(|endpoint| crate::kv_events::KvEventsConfig {
                endpoint,
                replay: self.kv_events_replay.clone(),
                topic: self.kv_events_topic.clone(),
            });
        let name = self.served_model_name.clone().unwrap_or_else(|| {
            self.model
                .file_stem()
                .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
        });
        Ok(ServeConfig {
            served_model_name: name,
            adapters: self.adapters.clone(),
            addr: SocketAddr::new(self.host, self.port),
            max_queue: self.max_queue,
            max_body_bytes: self.max_body_bytes,
            runtime_lora: self.allow_runtime_lora,
            guard: crate::guard::Guard {
                api_key: self.api_key.clone(),
                allowed_origins: self.allowed_origins.clone(),
            },
            shutdown_timeout: Duration::from_secs_f64(self.shutdown_timeout),
            engine,
            kv_events,
        })
    }
}

/// `kvsched serve`: see `kvsched serve --help`. Exit status 0 after a shutdown, 2 for bad flags or
/// a model or adapter that does not load, 1 when the server fails.
pub fn cli(args: &[String]) -> ExitCode {
    let parsed = <ServeArgs as clap::Parser>::try_parse_from(
        std::iter::once("kvsched serve".to_string()).chain(args.iter().cloned()),
    );
    let a = match parsed {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let config = match a.config() {
        Ok(c) => c,
        Err(e) => return fail(&e.to_string(), 2),
    };
    kvsched_engine::init_threads(usize::from(a.threads));
    let mut model = match Model::load(&a.model) {
        Ok(m) => m,
        Err(e) => return fail(&e.to_string(), 2),
    };
    if let Some(path) = &a.chat_template {
        match std::fs::read_to_string(path) {
            Ok(t) => model.set_chat_template(t),
            Err(e) => return fail(&format!("--chat-template {}: {e}", path.display()), 2),
        }
    }
    if model.tokenizer().chat_template().is_none() {
        eprintln!(
            "kvsched serve: {} has no chat template: /v1/chat/completions is refused (give one with --chat-template FILE)",
            a.model.display()
        );
    }
    let model = Arc::new(model);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the runtime: {e}"), 2),
    };
    let server = match Server::start(model, &config) {
        Ok(s) => s,
        Err(e) => return fail(&e.to_string(), 2),
    };
    match rt.block_on(run(server, &config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e.to_string(), 1),
    }
}

fn fail(message: &str, code: u8) -> ExitCode {
    eprintln!("kvsched serve: {message}");
    ExitCode::from(code)
}

/// Serves until SIGTERM or Ctrl-C, then shuts down.
async fn run(server: Server, config: &ServeConfig) -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    println!("kvsched serve: listening on http://{}", server.addr());
    let _ = std::io::stdout().flush();
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    eprintln!(
        "kvsched serve: shutting down (in-flight requests have {:.1} s)",
        config.shutdown_timeout.as_secs_f64()
    );
    server.shutdown()
}

/// `CLASS:requests=N,kv_tokens=N,adapter_pages=N` (`--class-share`).
fn class_share(v: &str) -> Result<(u8, kvsched_core::config::Share), String> {
    let (class, share) = v.split_once(':').ok_or_else(|| {
        format!("expected CLASS:requests=N,kv_tokens=N,adapter_pages=N, got {v:?}")
    })?;
    let class: u8 = class
        .parse()
        .ok()
        .filter(|&c| usize::from(c) < kvsched_core::config::SERVICE_CLASSES)
        .ok_or_else(|| format!("the class in {v:?} is not 0 to 3"))?;
    let share = share.parse().map_err(|e: &str| format!("{e}, got {v:?}"))?;
    Ok((class, share))
}

#[cfg(test)]
mod tests {
    use super::host_address;
    use clap::Parser as _;

    /// `--host localhost` was refused as not an IP address (issue 43). (No name here that would be
    /// looked up beyond this machine's hosts file.)
    #[test]
    fn a_host_name_resolves_and_an_address_stands() {
        assert!(host_address("localhost").is_ok_and(|ip| ip.is_loopback()));
        for ip in ["127.0.0.1", "::1"] {
            assert_eq!(
                host_address(ip).ok().map(|a| a.to_string()).as_deref(),
                Some(ip)
            );
        }
    }

    /// A value that does not parse is refused with its own words, not as another flag's.
    #[test]
    fn a_bad_value_names_itself() {
        let adapter = super::named_path("no-equals").unwrap_err().to_string();
        assert_eq!(adapter, r#""no-equals" is not NAME=PATH"#);
        assert!(host_address("").is_err());
    }

    /// `--class-share CLASS:SHARE`, repeated, sets each class's share; a class past 3 or a share
    /// that does not parse is refused with its own words.
    #[test]
    fn class_shares_are_read_per_class() {
        let args = super::ServeArgs::try_parse_from([
            "kvsched serve",
            "--model",
            "m.gguf",
            "--class-share",
            "0:requests=4,kv_tokens=2048",
            "--class-share",
            "2:adapter_pages=8",
        ])
        .unwrap();
        let shares = args.config().unwrap().engine.scheduler.shares.unwrap();
        assert_eq!((shares[0].requests, shares[0].kv_tokens), (4, 2048));
        assert_eq!((shares[1].requests, shares[2].adapter_pages), (0, 8));
        let none = super::ServeArgs::try_parse_from(["kvsched serve", "--model", "m.gguf"]);
        assert!(none
            .unwrap()
            .config()
            .unwrap()
            .engine
            .scheduler
            .shares
            .is_none());
        assert!(super::class_share("4:requests=1")
            .unwrap_err()
            .contains("not 0 to 3"));
        assert!(super::class_share("0:slots=1")
            .unwrap_err()
            .contains("names requests"));
    }
}
