//! `kvsched simulate` with a JSON report, for the test files that read one (`tests/simulate.rs`,
//! `tests/simulate_priority.rs`); beside `cli.rs`, which each includes as `mod cli`.

use std::path::PathBuf;

use crate::cli::{kvsched, tmp};

/// The JSON file at `path`.
pub fn json(path: &PathBuf) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Runs `kvsched simulate ARGS… --json FILE` (FILE named after `name`), which must succeed, and
/// returns its JSON report.
pub fn simulated(name: &str, args: &[&str]) -> serde_json::Value {
    let j = tmp(&format!("{name}.json"));
    let mut all = vec!["simulate"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--json", j.to_str().unwrap()]);
    let out = kvsched(&all);
    assert!(
        out.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&j)
}
