//! Dynamo's conformance kit (`dynamo_backend_common::testing::run_conformance`) against kvsched's
//! engine on SmolLM2, and against the same engine with a planted fault (cancellation ignored),
//! which must fail it; then what the kit does not check: the tokens are the engine's own, limits
//! are refused by field, a stop token ends the request, a stopped context frees the request's
//! place, `cleanup` drains.

#[path = "../../engine/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dynamo_backend_common::testing::{mock_context, run_conformance, ConformanceFailure};
use dynamo_backend_common::{
    AsyncEngineContext, DynamoError, EngineConfig, FinishReason, GenerateContext, KvEventSource,
    LLMEngine, LLMEngineOutput, OutputOptions, PreprocessedRequest, SamplingOptions,
    StopConditions,
};
use futures::stream::{BoxStream, StreamExt};
use kvsched_dynamo::{KvschedEngine, Setup};
use kvsched_engine::{Engine, Model, Sampler};
use kvsched_server::kv_events::KvEventsConfig;
use kvsched_server::ServeConfig;

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The test model's path (skipped outside CI when absent), candle on one thread.
fn model_path() -> Option<PathBuf> {
    let path = common::model_path()?;
    kvsched_engine::init_threads(1);
    Some(path)
}

/// `kvsched-dynamo`'s defaults on `model`, KV events on a free loopback port, a 2 s drain.
fn setup(model: &Path) -> Setup {
    Setup {
        model: model.to_path_buf(),
        served_model_name: "smollm2".into(),
        engine: ServeConfig::engine(2048, 16, 512),
        max_queue: 16,
        kv_events: Some(KvEventsConfig {
            endpoint: format!("tcp://127.0.0.1:{}", free_port()),
            replay: None,
            topic: String::new(),
        }),
        drain_timeout: Duration::from_secs(2),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kvsched_engine_passes_dynamos_conformance_kit() {
    let Some(path) = model_path() else { return };
    run_conformance(|| KvschedEngine::new(setup(&path)))
        .await
        .expect("the conformance kit passes");
}

/// The planted fault: the engine never sees the request's context, so a cancelled stream runs on.
struct IgnoresCancellation(KvschedEngine);

#[async_trait]
impl LLMEngine for IgnoresCancellation {
    async fn start(&self, worker_id: u64) -> Result<EngineConfig, DynamoError> {
        self.0.start(worker_id).await
    }

    async fn generate(
        &self,
        r: PreprocessedRequest,
        _ctx: GenerateContext,
    ) -> Result<BoxStream<'static, Result<LLMEngineOutput, DynamoError>>, DynamoError> {
        self.0
            .generate(r, GenerateContext::new(mock_context(), None))
            .await
    }

    async fn cleanup(&self) -> Result<(), DynamoError> {
        self.0.cleanup().await
    }

    async fn kv_event_sources(&self) -> Result<Vec<KvEventSource>, DynamoError> {
        self.0.kv_event_sources().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_ignores_cancellation_fails_the_kit() {
    let Some(path) = model_path() else { return };
    let failure = run_conformance(|| IgnoresCancellation(KvschedEngine::new(setup(&path))))
        .await
        .expect_err("the kit catches the ignored cancellation");
    assert!(
        matches!(
            failure,
            ConformanceFailure::CancellationNotObserved { .. }
                | ConformanceFailure::CancellationIgnored
        ),
        "{failure}"
    );
}

/// A greedy request for `prompt` of at most `max_tokens`.
fn request(prompt: Vec<u32>, max_tokens: Option<u32>) -> PreprocessedRequest {
    PreprocessedRequest::builder()
        .model("smollm2".to_string())
        .token_ids(prompt)
        .stop_conditions(StopConditions {
            max_tokens,
            ..Default::default()
        })
        .sampling_options(SamplingOptions::default())
        .output_options(OutputOptions::default())
        .build()
        .expect("a request")
}

/// Every chunk of `r`'s stream on `engine`, under `ctx`.
async fn run(
    engine: &KvschedEngine,
    r: PreprocessedRequest,
    ctx: Arc<dyn AsyncEngineContext>,
) -> Vec<LLMEngineOutput> {
    let stream = engine
        .generate(r, GenerateContext::new(ctx, None))
        .await
        .expect("generate");
    stream.map(|c| c.expect("a chunk")).collect().await
}

/// The prompt of a chat turn.
fn prompt(model: &Model, text: &str) -> Vec<u32> {
    model
        .tokenizer()
        .encode_chat(&[kvsched_engine::Message::user(text)], true)
        .expect("a prompt")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_the_engines_own_and_end_in_one_terminal_with_usage() {
    let Some(path) = model_path() else { return };
    let model = Model::load(&path).expect("the model loads");
    let engine = KvschedEngine::new(setup(&path));
    engine.start(0).await.expect("start");
    let p = prompt(&model, "Name three colours.");
    let chunks = run(&engine, request(p.clone(), Some(24)), mock_context()).await;
    let (last, body) = chunks.split_last().expect("chunks");
    assert!(body.iter().all(|c| c.finish_reason.is_none()));
    let tokens: Vec<u32> = chunks.iter().flat_map(|c| c.token_ids.clone()).collect();
    let mut alone = Engine::new(&model, ServeConfig::engine(2048, 16, 512)).expect("an engine");
    alone
        .submit(&p, 24, None, Sampler::greedy())
        .expect("submit");
    let want = alone.run().expect("run").pop().expect("one").tokens;
    assert_eq!(tokens, want, "the tokens the engine makes alone");
    let usage = last
        .completion_usage
        .as_ref()
        .expect("usage on the terminal");
    assert_eq!(
        (usage.prompt_tokens, usage.completion_tokens),
        (p.len() as u32, tokens.len() as u32)
    );
    let stopped = model.tokenizer().is_stop(*want.last().unwrap());
    let reason = last.finish_reason.as_ref().expect("a finish reason");
    assert_eq!(matches!(reason, FinishReason::Stop), stopped, "{reason:?}");
    assert_eq!(
        matches!(reason, FinishReason::Length),
        !stopped,
        "{reason:?}"
    );
    engine.cleanup().await.expect("cleanup");
}
