//! The official `openai` Python client (pinned, installed into a virtualenv under the build folder,
//! never into the system Python) against a server started in process: completions and chat, whole
//! and streamed, an adapter as `model`, stop sequences, seeds, the client's typed errors,
//! `models.retrieve`, log probabilities, `response_format` with a JSON schema (the output parsed and
//! validated against it), `cache_salt` and `cached_tokens`, `n = 3` whole and streamed, `priority`
//! refused without priority scheduling (server/tests/python/openai_client.py); vLLM's `priority`
//! under `--scheduling-policy priority` (server/tests/python/priority.py); and kvsched's
//! `service_class` with `--class-share` (server/tests/python/classes.py).

#[path = "support/serve.rs"]
mod serve;

use std::path::PathBuf;
use std::process::Command;

/// The client's version (its wheel from PyPI).
const OPENAI: &str = "openai==3.57.0";

/// The virtualenv's interpreter, with the client installed; made first when it is not there (once
/// per process: the tests run beside each other and would otherwise race to make it).
fn python() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON.get_or_init(make_python).clone()
}

fn make_python() -> PathBuf {
    let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("openai-venv");
    let bin = venv.join("bin/python");
    if !bin.exists() {
        let base = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let ok = Command::new(&base).args(["-m", "venv"]).arg(&venv).status();
        assert!(
            ok.is_ok_and(|s| s.success()),
            "`{base} -m venv {}` failed",
            venv.display()
        );
    }
    let has = Command::new(&bin)
        .args([
            "-c",
            &format!(
                "import openai, sys; sys.exit(openai.__version__ != {:?})",
                &OPENAI[8..]
            ),
        ])
        .status()
        .is_ok_and(|s| s.success());
    if !has {
        let ok = Command::new(&bin)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                OPENAI,
            ])
            .status();
        assert!(
            ok.is_ok_and(|s| s.success()),
            "`pip install {OPENAI}` into {} failed",
            venv.display()
        );
    }
    bin
}

/// Runs `script` (under tests/python) against `server` with the client's environment; its stdout.
fn run_client(script: &str, server: &kvsched_server::Server, adapter: &str) -> String {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let out = Command::new(python())
        .arg(&script)
        .env("KVSCHED_URL", format!("http://{}", server.addr()))
        .env("KVSCHED_BASE", serve::BASE)
        .env("KVSCHED_ADAPTER", adapter)
        .env("NO_PROXY", "127.0.0.1")
        .output()
        .expect("run the client script");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    stdout
}

#[test]
fn the_openai_client_completes_chats_streams_and_reads_errors() {
    let Some(m) = serve::model() else { return };
    let (_, dir) = serve::peft_adapter(&m, 21);
    let mut cfg = serve::config();
    cfg.adapters = vec![("tuned".into(), dir)];
    let server = serve::start(&m, &cfg);
    let stdout = run_client("openai_client.py", &server, "tuned");
    assert!(stdout.contains("14 checks passed"), "{stdout}");
}

/// `kvsched serve --scheduling-policy priority --max-num-seqs 1`: vLLM's `priority`, sent through the
/// client's `extra_body`, makes a running stream yield to a higher priority, never to an equal one.
#[test]
fn the_openai_client_priority_overtakes_a_running_stream() {
    let Some(m) = serve::model() else { return };
    let mut cfg = serve::config();
    cfg.engine.scheduler.admission = kvsched_core::config::Admission::Priority;
    cfg.engine.scheduler.max_num_requests = 1;
    let server = serve::start(&m, &cfg);
    let stdout = run_client("priority.py", &server, "");
    assert!(stdout.contains("2 checks passed"), "{stdout}");
}

/// `kvsched serve --max-num-seqs 2 --class-share 0:requests=1` with a host tier: a class-0 request,
/// sent with `service_class` through `extra_body`, takes a batch slot back from two class-1 streams;
/// /metrics has each class's latencies.
#[test]
fn the_openai_client_service_class_takes_its_share_back() {
    let Some(m) = serve::model() else { return };
    let mut cfg = serve::config();
    let sched = &mut cfg.engine.scheduler;
    sched.max_num_requests = 2;
    let share = kvsched_core::config::Share {
        requests: 1,
        ..Default::default()
    };
    let mut shares =
        [kvsched_core::config::Share::default(); kvsched_core::config::SERVICE_CLASSES];
    shares[0] = share;
    sched.shares = Some(shares);
    cfg.engine.host_pages = 256;
    let server = serve::start(&m, &cfg);
    let stdout = run_client("classes.py", &server, "");
    assert!(stdout.contains("3 checks passed"), "{stdout}");
}
