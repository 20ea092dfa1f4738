//! The bad-input matrix for scenario files (DESIGN.md §5, docs/RELIABILITY.md): every malformed file is
//! refused with an error that names the file and the field at fault, and the file is left untouched.

use std::path::{Path, PathBuf};

/// Writes `text` to `name` in `dir` and returns its path.
fn file(dir: &tempfile::TempDir, name: &str, text: &[u8]) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// On the test thread's own stack: the runner's scheduler keeps its arrays on the heap.
#[test]
fn malformed_scenario_files_are_refused_with_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let ok = br#"{"name": "x", "requests": [{"id": 0}], "expect": {"generation": [0]}}"#;
    assert_eq!(
        kvsched_conformance::run_file(&file(&dir, "ok.json", ok)).map_err(|e| e.to_string()),
        Ok("x".into())
    );
    let cases: [(&str, &str, &str); 12] = [
        ("not JSON", "{", "malformed"),
        ("empty", "", "malformed"),
        (
            "unknown top-level field",
            r#"{"name": "x", "requests": [], "bogus": 1}"#,
            "bogus",
        ),
        (
            "unknown config field",
            r#"{"name": "x", "requests": [], "config": {"max_tokens": 1}}"#,
            "max_tokens",
        ),
        ("missing requests", r#"{"name": "x"}"#, "requests"),
        (
            "wrong type",
            r#"{"name": "x", "requests": [{"id": "zero"}]}"#,
            "malformed",
        ),
        (
            "unknown state",
            r#"{"name": "x", "requests": [{"id": 0, "state": "RUNNING"}], "expect": {}}"#,
            "state",
        ),
        (
            "position past the prompt",
            r#"{"name": "x", "requests": [{"id": 0, "prompt": 4, "position": 5}], "expect": {}}"#,
            "position",
        ),
        (
            "unknown policy",
            r#"{"name": "x", "requests": [], "config": {"policy": "fastest"}, "expect": {}}"#,
            "policy",
        ),
        (
            "bad script",
            r#"{"name": "x", "requests": [{"id": 0}], "kv": {"try_allocate_generation": "maybe"}, "expect": {}}"#,
            "try_allocate_generation",
        ),
        (
            "chunk unit 0",
            r#"{"name": "x", "requests": [], "config": {"chunking": {"policy": "fcfs", "unit": 0}}, "expect": {}}"#,
            "chunk unit",
        ),
        (
            // Found by the differential fuzz: the next pass panicked (pinned adapters over the cache).
            "added started requests whose leases overfill the adapter cache",
            r#"{"name": "x", "peft": {"max_device_pages": 1}, "requests": [], "passes": [{},
                {"add": [{"id": 0, "lora_task": 2, "state": "CONTEXT_INIT", "prompt": 34, "position": 1},
                         {"id": 1, "lora_task": 1, "state": "CONTEXT_INIT", "prompt": 55, "position": 1}]}]}"#,
            "passes[1].add[1]",
        ),
    ];
    for (case, text, needle) in cases {
        let path = file(&dir, "bad.json", text.as_bytes());
        let err = kvsched_conformance::run_file(&path)
            .expect_err(case)
            .to_string();
        assert!(err.contains(needle), "{case}: {err}");
        assert!(err.contains("bad.json"), "{case}: the file is named: {err}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            text.as_bytes(),
            "{case}: file untouched"
        );
    }
    let err = kvsched_conformance::run_file(Path::new("/nonexistent/x.json"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("/nonexistent/x.json"), "{err}");
    let err = kvsched_conformance::run_paths(&[PathBuf::from("/nonexistent")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("no such file"), "{err}");
}

/// `kv.groups` beside what a grouped backend does not hold, or groups the core refuses, are malformed,
/// with the field and the reason.
#[test]
fn kv_groups_the_backend_cannot_hold_are_refused_with_the_field_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let g = r#""groups": [{"window": 128}]"#;
    let cases = [
        (
            "a draft pool",
            format!(r#""kv": {{"draft": {{"mode": "joint"}}, {g}}}"#),
            "kv.draft: KV groups do not take a draft pool",
        ),
        (
            "a cross pool",
            format!(r#""kv": {{"cross": true, {g}}}"#),
            "kv.cross: KV groups do not take a cross pool",
        ),
        (
            "a connector",
            format!(r#""kv": {{"connector": true, {g}}}"#),
            "kv.connector: KV groups do not take a KV connector",
        ),
        (
            "sends in a later pass",
            format!(
                r#""kv": {{{g}}}, "passes": [{{"expect": {{}}}}, {{"sends_in_flight": true, "expect": {{}}}}]"#
            ),
            "passes[1].sends_in_flight: KV groups do not take",
        ),
        (
            "a window of part of a page",
            r#""kv": {"groups": [{"window": 100}]}"#.to_owned(),
            "kv.groups: invalid input: a sliding window must be a whole number of pages",
        ),
        (
            "no window group",
            r#""kv": {"groups": []}"#.to_owned(),
            "kv.groups: expected one or two window groups",
        ),
        (
            "three window groups",
            r#""kv": {"groups": [{"window": 64}, {"window": 64}, {"window": 64}]}"#.to_owned(),
            "kv.groups: more than 2 window groups",
        ),
        (
            "a bad window script",
            r#""kv": {"groups": [{"window": 64, "resize_context": "maybe"}]}"#.to_owned(),
            "kv.groups[0].resize_context",
        ),
    ];
    for (case, kv, needle) in cases {
        let expect = if kv.contains("passes") {
            ""
        } else {
            r#", "expect": {}"#
        };
        let text = format!(r#"{{"name": "g", "requests": [{{"id": 0}}], {kv}{expect}}}"#);
        let err = kvsched_conformance::run_file(&file(&dir, "g.json", text.as_bytes()))
            .expect_err(case)
            .to_string();
        assert!(err.contains(needle), "{case}: {err}");
    }
}

/// A folder without scenario files (a wrong path) is refused, not reported as `0 passed, 0 failed`.
#[test]
fn a_folder_without_scenarios_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    file(&dir, "notes.txt", b"not a scenario");
    let paths = [dir.path().to_path_buf()];
    let err = kvsched_conformance::run_paths(&paths).unwrap_err();
    assert!(
        matches!(err, kvsched_conformance::CollectError::Empty(_)),
        "{err:?}"
    );
    assert!(err.to_string().contains("no scenario files"), "{err}");
    assert!(
        err.to_string().contains(&dir.path().display().to_string()),
        "{err}"
    );
    let grouped = kvsched_conformance::grouped::run_paths_grouped(&paths).unwrap_err();
    assert!(
        grouped.to_string().contains("no scenario files"),
        "{grouped}"
    );
}
