//! The grouped suite: every scenario file of tests/conformance/ that KV groups can hold runs with its
//! target as the leader of one window group as long as a request, and every pass does exactly what
//! it does without groups (`kvsched conformance --grouped`).

use std::path::PathBuf;

#[test]
fn every_scenario_groups_can_hold_passes_exactly_as_without_groups() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/conformance");
    let report = kvsched_conformance::grouped::run_paths_grouped(&[dir]).expect("readable");
    println!("{}", report.summary());
    let failures: Vec<&String> = report
        .lines
        .iter()
        .filter(|l| !l.starts_with("ok "))
        .collect();
    assert!(failures.is_empty(), "differ on groups:\n{failures:#?}");
    assert!(report.same >= 200, "{}", report.summary());
}
