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
    let cases: [(&str, &str, &str); 11] = [
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
