//! Builds `examples/c/serve_loop.c` with the system C compiler against the static library and the
//! checked-in header, under AddressSanitizer and UndefinedBehaviorSanitizer, and runs it.

use std::path::PathBuf;

#[path = "support/build.rs"]
mod build;

#[test]
fn the_c_serving_loop_builds_and_runs_under_the_sanitizers() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let bin = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("serve_loop");
    build::compile_sanitized(&root.join("examples/c/serve_loop.c"), &bin);
    let stdout = build::run_c(&bin, &[]);
    assert!(stdout.contains("served 24 requests"), "{stdout}");
    assert!(stdout.contains("disaggregated: request 42"), "{stdout}");
    assert!(stdout.contains("published 4 stored blocks"), "{stdout}");
}
