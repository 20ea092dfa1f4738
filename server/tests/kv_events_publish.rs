//! `kvsched serve --kv-events` as a KV-aware router sees it: a server started in process publishes
//! on loopback ZMQ sockets on free ports; a pyzmq subscriber (in the test virtualenv, beside vLLM's
//! own structs from the pinned wheel) sends a prompt to the base model and to an adapter, decodes
//! every batch with vLLM's decoder (msgspec re-encodes the same bytes), checks the sequence numbers,
//! the first block's missing parent, each adapter's blocks keyed apart under its served name (one
//! given at start, one loaded at run time), and
//! replays every batch from 0 through the replay socket
//! (server/tests/python/kv_events_subscribe.py).

#[path = "support/serve.rs"]
mod serve;
#[path = "support/vllm.rs"]
mod vllm;

use std::path::PathBuf;
use std::process::Command;

use kvsched_server::kv_events::KvEventsConfig;

/// A free loopback port (bound, then let go).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn a_subscriber_decodes_every_batch_with_vllms_structs_and_replays_them() {
    let Some(m) = serve::model() else { return };
    let py = vllm::python();
    let wheel = vllm::wheel(&py);
    let (_, dir) = serve::peft_adapter(&m, 33);
    let (_, loaded) = serve::peft_adapter(&m, 34);
    let endpoint = format!("tcp://127.0.0.1:{}", free_port());
    let replay = format!("tcp://127.0.0.1:{}", free_port());
    let mut cfg = serve::config();
    cfg.adapters = vec![("tuned".into(), dir)];
    cfg.runtime_lora = true;
    cfg.kv_events = Some(KvEventsConfig {
        endpoint: endpoint.clone(),
        replay: Some(replay.clone()),
        topic: String::new(),
    });
    let server = serve::start(&m, &cfg);
    let prompt = "The scheduler decides which requests run in each iteration of the serving loop, \
        generation first and then chunked prefill, within a token budget and a batch limit, and it \
        owns the paged KV cache of the model.";
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/kv_events_subscribe.py");
    let url = format!("http://{}", server.addr());
    let out = vllm::run(
        Command::new(&py)
            .arg(script)
            .args([
                wheel.to_str().unwrap(),
                &endpoint,
                &replay,
                &url,
                serve::BASE,
                "tuned",
                prompt,
                loaded.to_str().unwrap(),
            ])
            .env("NO_PROXY", "127.0.0.1"),
        "the subscriber",
    );
    assert!(out.ends_with("ok\n"), "{out}");
    let summary: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    let stores = summary["stores"].as_array().unwrap();
    assert!(stores.len() >= 2, "{summary}");
    assert!(summary["replayed"].as_u64() >= summary["batches"].as_u64());
    eprintln!("{summary}");
    server.shutdown().unwrap();
}
