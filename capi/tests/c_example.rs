//! Builds `examples/c/serve_loop.c` with the system C compiler against the static library and the
//! checked-in header, under AddressSanitizer and UndefinedBehaviorSanitizer, and runs it.

use std::path::PathBuf;
use std::process::Command;

#[path = "support/build.rs"]
mod build;

#[test]
fn the_c_serving_loop_builds_and_runs_under_the_sanitizers() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let lib = build::build_library("kvsched-capi").join("libkvsched_capi.a");
    assert!(lib.exists(), "{} missing", lib.display());
    let bin = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("serve_loop");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g"])
        .args(["-fsanitize=address,undefined", "-fno-sanitize-recover=all"])
        .arg("-I")
        .arg(root.join("capi/include"))
        .arg(root.join("examples/c/serve_loop.c"))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&bin)
        .output()
        .expect("run the C compiler");
    assert!(
        built.status.success(),
        "{cc} failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let run = Command::new(&bin)
        // The Rust runtime's one-time allocations live until exit: not leaks of the library's.
        .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1")
        .env("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "serve_loop failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("served 24 requests"), "{stdout}");
    assert!(stdout.contains("disaggregated: request 42"), "{stdout}");
    assert!(stdout.contains("published 4 stored blocks"), "{stdout}");
}
