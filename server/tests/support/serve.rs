//! What the server's tests share: the test model (loaded once per test binary; skipped outside CI
//! when absent, failed under CI), a server of its own for each test on a free loopback port, and
//! the same requests run in process on the engine for comparison.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use kvsched_engine::{Engine, Lora, Model, Sampler};
use kvsched_server::{ServeConfig, Server};

#[path = "../../../engine/tests/common/mod.rs"]
mod common;

/// The test model, loaded once, with candle on one thread; `None`: skipped (outside CI).
pub fn model() -> Option<Arc<Model>> {
    static MODEL: OnceLock<Arc<Model>> = OnceLock::new();
    let path = common::model_path()?;
    kvsched_engine::init_threads(1);
    Some(Arc::clone(MODEL.get_or_init(|| {
        Arc::new(Model::load(&path).expect("the test model loads"))
    })))
}

/// The served model's name in these tests.
pub const BASE: &str = "smollm2";

/// A configuration for a test server on any free loopback port.
pub fn config() -> ServeConfig {
    ServeConfig {
        served_model_name: BASE.into(),
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        max_queue: 16,
        shutdown_timeout: Duration::from_secs(2),
        ..ServeConfig::default()
    }
}

/// Starts a server over `model` with `config`.
pub fn start(model: &Arc<Model>, config: &ServeConfig) -> Server {
    Server::start(Arc::clone(model), config).expect("the server starts")
}

/// A folder of this test process's own.
pub fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvsched-serve-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A seeded adapter written as a PEFT directory; returns the adapter and its folder.
pub fn peft_adapter(model: &Model, seed: u64) -> (Lora, PathBuf) {
    let lora = Lora::seeded(model.config(), 8, 16.0, 0.1, seed);
    let dir = tmp(&format!("adapter-{seed}"));
    lora.write_peft(model.config(), &dir)
        .expect("write the adapter");
    (lora, dir)
}

/// `prompt`'s greedy completion of `max_new` tokens run in process on a fresh engine of the test
/// server's configuration (the adapter, if given, registered as id 1): the generated tokens, a stop
/// token included.
pub fn in_process(model: &Model, prompt: &[u32], max_new: usize, lora: Option<&Lora>) -> Vec<u32> {
    let mut engine = Engine::new(model, config().engine).expect("an engine");
    if let Some(l) = lora {
        engine.register_adapter(1, l).expect("register the adapter");
    }
    engine
        .submit(prompt, max_new, lora.map(|_| 1), Sampler::greedy())
        .expect("submit");
    let mut done = engine.run().expect("run");
    done.pop().expect("one completion").tokens
}

/// The text of generated `tokens` as the server returns it (special tokens left out).
pub fn text_of(model: &Model, tokens: &[u32]) -> String {
    let tok = model.tokenizer();
    let body: Vec<u32> = tokens
        .iter()
        .copied()
        .filter(|t| !tok.special_tokens().contains(t))
        .collect();
    tok.decode(&body).expect("decode")
}
