//! Builds a workspace package's library with the profile this test runs under (tests do not build a
//! package's static or dynamic library themselves), and compiles and runs the C programs of the tests.

// Each test file that includes this module uses part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// `cargo build -p PACKAGE` for this test's profile; the folder its libraries land in.
pub fn build_library(package: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test path");
    let profile_dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>/deps")
        .to_path_buf();
    let mut build = Command::new(env!("CARGO"));
    build.args(["build", "-q", "-p", package]);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    let built = build.status().expect("run cargo");
    assert!(built.success(), "cargo build -p {package} failed");
    profile_dir
}

/// Compiles C `source` into `bin` with the system C compiler (`$CC`, else `cc`): C11 with every warning
/// an error, then `args` (include folders, libraries, sanitizers). Fails the test with the compiler's
/// messages.
pub fn compile_c(source: &std::path::Path, bin: &std::path::Path, args: &[std::ffi::OsString]) {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror"])
        .arg(source)
        .args(args)
        .arg("-o")
        .arg(bin)
        .output()
        .expect("run the C compiler");
    assert!(
        built.status.success(),
        "{cc} {} failed:\n{}",
        source.display(),
        String::from_utf8_lossy(&built.stderr)
    );
}

/// [`compile_c`] against the static library (built for this test's profile) and the checked-in
/// header, under AddressSanitizer and UndefinedBehaviorSanitizer.
pub fn compile_sanitized(source: &std::path::Path, bin: &std::path::Path) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let lib = build_library("kvsched-capi").join("libkvsched_capi.a");
    assert!(lib.exists(), "{} missing", lib.display());
    let mut args: Vec<std::ffi::OsString> = [
        "-g",
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all",
        "-I",
    ]
    .map(Into::into)
    .to_vec();
    args.push(root.join("capi/include").into());
    args.push(lib.into());
    args.extend(["-lpthread", "-ldl", "-lm"].map(Into::into));
    compile_c(source, bin, &args);
}

/// Runs `bin` with `env`, failing the test when it does not exit 0; returns what it printed.
pub fn run_c(bin: &std::path::Path, env: &[(&str, &std::ffi::OsStr)]) -> String {
    let mut command = Command::new(bin);
    // Under the sanitizers: the Rust runtime's one-time allocations live until exit, not leaks of the
    // library's.
    command
        .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1")
        .env("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1");
    for (k, v) in env {
        command.env(k, v);
    }
    let run = command.output().expect("run the C program");
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success(),
        "{} failed ({}):\n{stdout}\n{}",
        bin.display(),
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    stdout
}
