//! Builds the `kvsched._native` extension (this package's cdylib), lays it out as the `kvsched`
//! package beside `python/kvsched/`, and runs the pytest suite (`python/tests/test_*.py`) and the
//! example (`examples/python/replay.py`) against it, in a virtualenv under the build folder
//! (`target/tmp/pytest-venv`, made from `python3` or `$PYTHON` and kept between runs) into which
//! pytest, msgspec and hypothesis are installed when missing: never into the system Python.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../../capi/tests/support/build.rs"]
mod build;

/// The virtualenv's interpreter, the virtualenv made first when it is not there.
fn python() -> Command {
    let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pytest-venv");
    let bin = venv.join("bin/python");
    if !bin.exists() {
        let base = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let status = Command::new(&base)
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("run python3 -m venv");
        assert!(
            status.success(),
            "`{base} -m venv {}` failed",
            venv.display()
        );
    }
    Command::new(bin)
}

/// The built extension, laid out as an importable package; returns the folder to put on `PYTHONPATH`.
fn package(root: &Path) -> PathBuf {
    let profile_dir = build::build_library("kvsched-py");
    let lib = ["libkvsched_py.so", "libkvsched_py.dylib"]
        .iter()
        .map(|n| profile_dir.join(n))
        .find(|p| p.exists())
        .expect("the extension library");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pymodule");
    let pkg = dir.join("kvsched");
    std::fs::create_dir_all(&pkg).expect("package folder");
    for f in ["__init__.py", "_native.pyi", "py.typed"] {
        std::fs::copy(root.join("python/kvsched").join(f), pkg.join(f)).expect("copy the package");
    }
    std::fs::copy(lib, pkg.join("_native.abi3.so")).expect("copy the extension");
    dir
}

/// The suite's tools: pytest; msgspec (its KV event test decodes the wire format with it; the
/// version the server's vLLM tests pin); hypothesis (the random-operation test, `test_random_ops.py`,
/// pinned: its derandomized run is the same sequence of calls only for one version).
const TOOLS: [(&str, &str); 3] = [
    ("pytest", "pytest"),
    ("msgspec", "msgspec==0.23.0"),
    ("hypothesis", "hypothesis==6.170.15"),
];

fn ensure_pytest() {
    // A pinned package must be there at its version (a virtualenv kept from before may hold another).
    let has = |module: &str, package: &str| {
        let check = match package.split_once("==") {
            Some((dist, version)) => format!(
                "import {module}, importlib.metadata as m, sys; \
                 sys.exit(m.version({dist:?}) != {version:?})"
            ),
            None => format!("import {module}"),
        };
        python()
            .args(["-c", &check])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    for (module, package) in TOOLS {
        if !has(module, package) {
            let _ = python()
                .args(["-m", "pip", "install", "--quiet", package])
                .status();
        }
        assert!(
            has(module, package),
            "{module} is missing from the test virtualenv and `pip install {package}` did not install it"
        );
    }
}

#[test]
fn the_python_suite_and_example_pass_against_the_built_module() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = package(&root);
    ensure_pytest();
    let (tests, replay) = (
        root.join("python/tests"),
        root.join("examples/python/replay.py"),
    );
    let pytest = ["-m", "pytest", "-q", "-p", "no:cacheprovider"].map(OsStr::new);
    let stdout = run_python(&path, &[&pytest[..], &[tests.as_os_str()]].concat());
    assert!(stdout.contains(" passed"), "{stdout}");
    let stdout = run_python(
        &path,
        &[replay.as_os_str(), "--requests".as_ref(), "200".as_ref()],
    );
    assert!(stdout.contains("replayed 200 requests"), "{stdout}");
    assert!(
        stdout.contains("schedule() from Python, S1-256"),
        "{stdout}"
    );
}

/// Runs `python3 ARGS` against the built package in `path`, from that folder (so that the source
/// package in `python/`, without the extension, does not shadow the built one); its stdout, once it
/// succeeded.
fn run_python(path: &Path, args: &[&OsStr]) -> String {
    let out = python()
        .args(args)
        .current_dir(path)
        .env("PYTHONPATH", path)
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "python3 {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
