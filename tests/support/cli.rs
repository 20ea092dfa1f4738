//! Running the `kvsched` binary from an integration test: one helper for `tests/simulate.rs` and
//! `tests/cost.rs`.

use std::path::PathBuf;
use std::process::Command;

/// Runs `kvsched ARGS…` and returns what it printed and its status.
pub fn kvsched(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvsched"))
        .args(args)
        .output()
        .expect("kvsched runs")
}

/// A path for `name` in a folder of this test process's own.
pub fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvsched-cli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}
