//! `kvsched-dynamo`'s options: the model and engine (as `kvsched serve` takes them), the KV events
//! port, and Dynamo's common worker options (namespace, component, endpoint, discovery, planes),
//! each also read from its `DYN_*` variable.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use dynamo_backend_common::{CommonArgs, ModelInput, WorkerConfig};
use kvsched_server::kv_events::KvEventsConfig;
use kvsched_server::ServeConfig;

use crate::engine::Setup;

/// `kvsched-dynamo`'s options.
#[derive(Debug, Parser)]
#[command(
    name = "kvsched-dynamo",
    about = "Serves a GGUF model on kvsched's engine as an NVIDIA Dynamo worker (behind `python -m \
             dynamo.frontend`).",
    long_about = "Serves a GGUF model on kvsched's engine as an NVIDIA Dynamo worker: it writes the \
        model folder the frontend reads (tokenizer, chat template, config) from the GGUF's metadata, \
        registers with Dynamo's discovery, serves the generate endpoint (token ids in, token chunks \
        out), publishes its KV events for the KV-aware router, and drains on SIGTERM. See \
        docs/DYNAMO.md."
)]
pub struct Args {
    /// The GGUF model file (scripts/fetch-model.sh fetches the test model and prints its path).
    #[arg(long, value_name = "FILE")]
    pub model: PathBuf,
    /// The model's name in the API (default: the model file's name without .gguf).
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,
    /// Where to write the model folder the frontend reads (default: beside the GGUF file, in
    /// `NAME.dynamo/`).
    #[arg(long, value_name = "DIR")]
    pub model_dir: Option<PathBuf>,
    /// The longest request (prompt and output), tokens.
    #[arg(long, value_name = "N", default_value_t = 2048)]
    pub max_model_len: u32,
    /// Positions per KV page (Dynamo's router must hash with the same: `--kv-cache-block-size`).
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub block_size: u32,
    /// KV pages.
    #[arg(long, value_name = "N", default_value_t = 512)]
    pub gpu_pages: u32,
    /// Requests the engine runs at once.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub max_num_seqs: u32,
    /// Requests that may wait beyond them; past both, a request is refused (WorkerOverloaded).
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_queue: usize,
    /// Publish KV events on `tcp://127.0.0.1:PORT` (vLLM's format), which the worker registers
    /// for Dynamo's KV router; 0: none.
    #[arg(long, value_name = "PORT", default_value_t = 0)]
    pub kv_events_port: u16,
    /// How long a shutdown (SIGTERM) lets admitted requests run on before it aborts them, seconds;
    /// Dynamo's own bound (DYN_WORKER_GRACEFUL_SHUTDOWN_TIMEOUT), unless set, is made to cover it.
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0)]
    pub drain_timeout: f64,
    /// candle's CPU threads (its pool busy-waits: on contended cores 1 is fastest).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: u16,
    /// Dynamo's common worker options.
    #[command(flatten)]
    pub common: CommonArgs,
}

impl Args {
    /// The served name: `--served-model-name`, else the file's stem.
    pub fn served_name(&self) -> String {
        self.served_model_name.clone().unwrap_or_else(|| {
            self.model
                .file_stem()
                .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
        })
    }

    /// The model folder: `--model-dir`, else `NAME.dynamo/` beside the GGUF.
    pub fn folder(&self) -> PathBuf {
        self.model_dir.clone().unwrap_or_else(|| {
            self.model
                .with_file_name(format!("{}.dynamo", self.served_name()))
        })
    }

    /// The worker's engine setup.
    pub fn setup(&self) -> Setup {
        let mut engine = ServeConfig::engine(self.max_model_len, self.block_size, self.gpu_pages);
        engine.scheduler.max_num_requests = self.max_num_seqs;
        Setup {
            model: self.model.clone(),
            served_model_name: self.served_name(),
            engine,
            max_queue: self.max_queue,
            kv_events: (self.kv_events_port != 0).then(|| KvEventsConfig {
                endpoint: format!("tcp://127.0.0.1:{}", self.kv_events_port),
                replay: None,
                topic: String::new(),
            }),
            drain_timeout: Duration::from_secs_f64(self.drain_timeout.max(0.0)),
        }
    }

    /// Dynamo's worker configuration: the model folder as its model (the frontend reads the
    /// tokenizer from it), token ids in, KV routing on when KV events are.
    pub fn worker_config(&self) -> WorkerConfig {
        let c = &self.common;
        WorkerConfig {
            namespace: c.namespace.clone(),
            component: c.component.clone(),
            endpoint: c.endpoint.clone(),
            model_name: self.folder().to_string_lossy().into_owned(),
            served_model_name: Some(self.served_name()),
            model_input: ModelInput::Tokens,
            endpoint_types: c.endpoint_types.clone(),
            custom_jinja_template: c.custom_jinja_template.clone(),
            tool_call_parser: c.dyn_tool_call_parser.clone(),
            reasoning_parser: c.dyn_reasoning_parser.clone(),
            exclude_tools_when_tool_choice_none: c.exclude_tools_when_tool_choice_none,
            enable_kv_routing: self.kv_events_port != 0,
            disaggregation_mode: c.disaggregation_mode,
            runtime: c.runtime.clone(),
            ..WorkerConfig::default()
        }
    }
}
