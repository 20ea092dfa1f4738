//! Two `kvsched serve` replicas behind NVIDIA Dynamo: its standalone KV indexer (`python -m
//! dynamo.indexer`, from the pinned `ai-dynamo-runtime` wheel in a virtualenv under the build
//! folder), every socket on loopback: the indexer subscribes to both replicas' `--kv-events`, and
//! its `/query` for a prompt reports the replica that served it with the prompt's full blocks' tokens, the
//! other with none; an adapter's blocks match only queries under its served name; an eviction on
//! the replica lowers its count.
//!
//! And Dynamo's `KvRouter` (server/tests/python/dynamo_router.py: two Dynamo workers relaying the two
//! replicas' events, file discovery in a folder of the test's, the event plane on ZMQ) picks, for a
//! continuation of a prompt one replica served, that replica, with the prompt's full blocks matched; the
//! continuation sent there is a prefix hit in that replica's `/metrics`.
//!
//! The indexer's HTTP server binds every interface (it has no option for the address); the test
//! sends it traffic on 127.0.0.1 only, and sets Dynamo's advertised hosts to 127.0.0.1.

#[path = "support/http.rs"]
mod http;
#[path = "support/serve.rs"]
mod serve;
#[path = "support/vllm.rs"]
mod vllm;

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvsched_server::kv_events::KvEventsConfig;
use kvsched_server::ServeConfig;
use serde_json::{json, Value};

/// Dynamo's runtime (its standalone indexer and KvRouter; no torch, no CUDA).
const DYNAMO: &str = "ai-dynamo-runtime==1.6.1";
/// Dynamo's advertised addresses, set to loopback.
const HOSTS: [&str; 4] = [
    "DYN_EVENT_PLANE_HOST",
    "DYN_TCP_RPC_HOST",
    "DYN_SYSTEM_HOST",
    "DYN_TCP_RESPONSE_STREAM_HOST",
];

/// The virtualenv with Dynamo's runtime.
fn dynamo_python() -> PathBuf {
    vllm::venv("dynamo-venv", "import dynamo.indexer", &[DYNAMO])
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The indexer process, killed when dropped.
struct Indexer {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Indexer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Indexer {
    fn start(workers: &[(u32, &str)]) -> Self {
        let port = free_port();
        let list: Vec<String> = workers
            .iter()
            .map(|(id, at)| format!("{id}={at}"))
            .collect();
        let mut cmd = Command::new(dynamo_python());
        cmd.args([
            "-m",
            "dynamo.indexer",
            "--block-size",
            "16",
            "--threads",
            "1",
        ])
        .args(["--port", &port.to_string(), "--workers", &list.join(",")])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        for var in [
            "DYN_EVENT_PLANE_HOST",
            "DYN_TCP_RPC_HOST",
            "DYN_SYSTEM_HOST",
            "DYN_TCP_RESPONSE_STREAM_HOST",
        ] {
            cmd.env(var, "127.0.0.1");
        }
        let child = cmd.spawn().expect("the indexer starts");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let started = Instant::now();
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the indexer listens"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // Its subscribers connect to the replicas' PUB sockets.
        std::thread::sleep(Duration::from_secs(1));
        Self { child, addr }
    }

    /// Tokens matched per replica for `tokens` (under `lora`): `/query`'s scores, whole blocks'.
    fn matched(&self, tokens: &[u32], lora: Option<&str>) -> [u64; 2] {
        let mut q = json!({"token_ids": tokens, "model_name": "default"});
        if let Some(l) = lora {
            q["lora_name"] = json!(l);
        }
        let r = http::post(self.addr, "/query", &q);
        assert_eq!(r.status, 200, "{}", r.body);
        let scores = &r.json()["scores"];
        let of = |w: &str| scores[w]["0"].as_u64().unwrap_or(0);
        [of("1"), of("2")]
    }

    /// Waits until `matched` says `want` (events travel asynchronously).
    fn wait_for(&self, tokens: &[u32], lora: Option<&str>, want: [u64; 2]) {
        let started = Instant::now();
        loop {
            let got = self.matched(tokens, lora);
            if got == want {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "{got:?}, want {want:?} ({lora:?})"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn tokens(len: u32, seed: u32) -> Vec<u32> {
    (0..len)
        .map(|i| 100 + (i * 7 + seed * 131) % 5000)
        .collect()
}

fn complete(server: &kvsched_server::Server, model: &str, prompt: &[u32]) {
    let body = json!({"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0});
    let r = http::post(server.addr(), "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let _: Value = r.json();
}

/// A replica on free loopback ports with its KV events published, 12 pages of 16 positions (a
/// 150-token prompt needs 10 of them), an adapter `tuned` from `dir`.
fn replica(
    m: &std::sync::Arc<kvsched_engine::Model>,
    dir: &std::path::Path,
) -> (kvsched_server::Server, String) {
    let endpoint = format!("tcp://127.0.0.1:{}", free_port());
    let mut cfg = serve::config();
    cfg.engine = ServeConfig::engine(192, 16, 12);
    cfg.adapters = vec![("tuned".into(), dir.to_path_buf())];
    cfg.kv_events = Some(KvEventsConfig {
        endpoint: endpoint.clone(),
        replay: None,
        topic: String::new(),
    });
    (serve::start(m, &cfg), endpoint)
}

#[test]
fn dynamos_router_picks_the_replica_that_holds_a_prefix() {
    let Some(m) = serve::model() else { return };
    let (_, dir) = serve::peft_adapter(&m, 35);
    let ((a, at_a), (b, at_b)) = (replica(&m, &dir), replica(&m, &dir));
    let discovery = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("dynamo-kv-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&discovery);
    std::fs::create_dir_all(&discovery).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/dynamo_router.py");
    let prompt: Vec<String> = tokens(70, 3).iter().map(u32::to_string).collect();
    let mut cmd = Command::new(dynamo_python());
    cmd.arg(script)
        .args([
            &at_a,
            &at_b,
            &format!("http://{}", a.addr()),
            &format!("http://{}", b.addr()),
        ])
        .arg(prompt.join(","))
        .env("DYN_FILE_KV", &discovery)
        .env("NO_PROXY", "127.0.0.1");
    for var in HOSTS {
        cmd.env(var, "127.0.0.1");
    }
    let out = vllm::run(&mut cmd, "the router");
    assert!(out.lines().any(|l| l == "ok"), "{out}");
    let summary: Value =
        serde_json::from_str(out.lines().find(|l| l.starts_with('{')).unwrap()).unwrap();
    assert_eq!(summary["best"][2], 4, "the prompt's 4 full blocks matched");
    assert!(summary["hit_tokens"].as_f64() >= Some(64.0), "{summary}");
    eprintln!("{summary}");
    a.shutdown().unwrap();
    b.shutdown().unwrap();
}

#[test]
fn dynamos_indexer_sees_which_replica_holds_a_prefix() {
    let Some(m) = serve::model() else { return };
    let (_, dir) = serve::peft_adapter(&m, 34);
    let ((a, at_a), (b, at_b)) = (replica(&m, &dir), replica(&m, &dir));
    let indexer = Indexer::start(&[(1, &at_a), (2, &at_b)]);
    // 70 tokens: 4 full blocks, on replica A.
    let p = tokens(70, 1);
    complete(&a, serve::BASE, &p);
    indexer.wait_for(&p, None, [4 * 16, 0]);
    // The same prompt under the adapter, on replica B: its blocks match only under its name.
    complete(&b, "tuned", &p);
    indexer.wait_for(&p, Some("tuned"), [0, 4 * 16]);
    assert_eq!(
        indexer.matched(&p, None),
        [4 * 16, 0],
        "the base model's blocks are A's only"
    );
    // A 150-token prompt on A takes 10 of its 12 pages: two of the prompt's blocks are evicted,
    // the deepest first.
    complete(&a, serve::BASE, &tokens(150, 2));
    indexer.wait_for(&p, None, [2 * 16, 0]);
    drop(indexer);
    a.shutdown().unwrap();
    b.shutdown().unwrap();
}
