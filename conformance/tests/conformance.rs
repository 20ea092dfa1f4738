//! Runs every scenario of the repository's tests/conformance/ through the real scheduling pass (as
//! `kvsched conformance`).

use std::path::PathBuf;

#[test]
fn every_conformance_scenario_passes() {
    // On the test thread's own stack: the runner's scheduler keeps its arrays on the heap.
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/conformance");
    let report = kvsched_conformance::run_paths(&[dir]).expect("scenario folder is readable");
    let failures: Vec<&String> = report
        .lines
        .iter()
        .filter(|l| !l.starts_with("ok "))
        .collect();
    println!("{}", report.summary());
    assert!(
        report.passed >= 230,
        "expected at least 230 scenarios, ran {}",
        report.passed + report.failed
    );
    // The IN scenarios' steady passes are incremental, each checked against the full pass.
    assert!(report.incremental >= 7, "{}", report.summary());
    assert!(
        failures.is_empty(),
        "failing scenarios:\n{}",
        failures
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn a_wrong_expectation_fails_and_a_malformed_file_names_file_field_and_reason() {
    let dir = std::env::temp_dir().join(format!("kvsched-conf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let wrong = dir.join("wrong.json");
    std::fs::write(
        &wrong,
        r#"{"name": "wrong", "kv": {"try_allocate_generation": {"calls": [false, true]}},
            "requests": [{"id": 0}, {"id": 99}], "expect": {"generation": [0], "paused": [0]}}"#,
    )
    .unwrap();
    let typo = dir.join("typo.json");
    std::fs::write(
        &typo,
        r#"{"name": "typo", "requests": [{"id": 0, "promt": 5}], "expect": {}}"#,
    )
    .unwrap();
    let bad_script = dir.join("script.json");
    std::fs::write(
        &bad_script,
        r#"{"name": "s", "kv": {"resize_context": "maybe"}, "requests": [], "expect": {}}"#,
    )
    .unwrap();
    let run = |p: &PathBuf| kvsched_conformance::run_file(p).map_err(|e| e.to_string());
    let e = run(&wrong).unwrap_err();
    assert!(e.contains("paused: expected [0], got [99]"), "{e}");
    let e = run(&typo).unwrap_err();
    assert!(e.contains("typo.json") && e.contains("promt"), "{e}");
    let e = run(&bad_script).unwrap_err();
    assert!(
        e.contains("kv.resize_context") && e.contains("\"ok\" or \"fail\""),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
