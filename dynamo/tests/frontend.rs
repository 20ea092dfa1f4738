//! End to end: Dynamo's frontend (`python -m dynamo.frontend --router-mode kv`, from the pinned
//! `ai-dynamo` 1.6.1 in a virtualenv under the build folder) over two `kvsched-dynamo` workers on
//! SmolLM2, driven by the official `openai` client (dynamo/tests/python/frontend_e2e.py).
//!
//! It runs inside a network namespace of its own with only loopback (`unshare -n`): Dynamo 1.6.1
//! binds its ZMQ event sockets on every interface, and there every interface is loopback, so no
//! packet leaves this machine. The virtualenv is made (and filled from PyPI) before, outside it.

#[path = "../../engine/tests/common/mod.rs"]
mod common;
#[path = "../../server/tests/support/vllm.rs"]
mod vllm;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Dynamo's frontend package, installed without its requirements (which requirements.txt pins).
const DYNAMO: &str = "ai-dynamo==1.6.1";

/// The virtualenv under the build folder with the frontend and the `openai` client: the pinned
/// requirements first, then the frontend without its own (its `aisimulate` is not on PyPI here).
pub fn venv() -> PathBuf {
    let requirements = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/requirements.txt");
    let requirements = requirements.to_str().expect("a UTF-8 path");
    let name = "dynamo-frontend-venv";
    vllm::venv(
        name,
        "import openai, zmq, transformers",
        &["-r", requirements],
    );
    vllm::venv(name, "import dynamo.frontend", &["--no-deps", DYNAMO])
}

/// A folder of this run's own, emptied first.
fn work(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `script` with `python` in a new network namespace whose only interface is loopback, brought
/// up first; its stdout.
pub fn in_loopback_namespace(python: &Path, script: &str, args: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let mut cmd = Command::new("unshare");
    cmd.args(["-n", "sh", "-c", "ip link set lo up && exec \"$0\" \"$@\""])
        .arg(python)
        .arg(script)
        .args(args);
    vllm::run(&mut cmd, "the script in a loopback-only namespace")
}

#[test]
fn the_frontend_routes_to_the_holder_cancels_and_drains() {
    let Some(model) = common::model_path() else {
        return;
    };
    let python = venv();
    let work = work("frontend-e2e");
    let out = in_loopback_namespace(
        &python,
        "frontend_e2e.py",
        &[
            env!("CARGO_BIN_EXE_kvsched-dynamo"),
            model.to_str().expect("a UTF-8 path"),
            work.to_str().expect("a UTF-8 path"),
        ],
    );
    println!("{out}");
    assert!(out.lines().last() == Some("ok"), "{out}");
}
