//! The top-level command line and the small commands' rough edges: the usage comes from clap
//! (`--version`, `help`, `help COMMAND`), usage mistakes exit 2; `kvsched conformance` has `--help` and
//! fails on paths without scenario files; `kvsched bench` says µs where it prints µs, lists the valid
//! names of a wrong one and keeps its columns aligned for every scenario.

#[path = "support/cli.rs"]
mod cli;
use cli::{kvsched, tmp};

fn text(out: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn version_help_and_usage_mistakes() {
    let out = kvsched(&["--version"]);
    let (stdout, _) = text(&out);
    assert!(out.status.success());
    assert_eq!(
        stdout.trim(),
        format!("kvsched {}", env!("CARGO_PKG_VERSION"))
    );

    let out = kvsched(&["help"]);
    let (stdout, _) = text(&out);
    assert!(out.status.success(), "{stdout}");
    for command in ["simulate", "conformance", "bench", "generate", "serve"] {
        assert!(stdout.contains(command), "{command} missing: {stdout}");
    }
    // `help COMMAND` is the command's own help.
    let out = kvsched(&["help", "conformance"]);
    let (stdout, _) = text(&out);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("--grouped"), "{stdout}");

    for args in [&[][..], &["bogus"], &["help", "bogus"]] {
        let out = kvsched(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {:?}", text(&out));
    }
}

#[test]
fn conformance_has_help_and_refuses_paths_without_scenarios() {
    let out = kvsched(&["conformance", "--help"]);
    let (stdout, _) = text(&out);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("<PATH>"), "{stdout}");

    let dir = tmp("no-scenarios");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "not a scenario").unwrap();
    let path = dir.to_str().unwrap();
    for args in [
        vec!["conformance", path],
        vec!["conformance", "--grouped", path],
    ] {
        let out = kvsched(&args);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stdout}{stderr}");
        assert!(stderr.contains("no scenario files"), "{stderr}");
        assert!(!stdout.contains("0 passed"), "{stdout}");
    }
    let out = kvsched(&["conformance"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn bench_words_its_units_names_and_columns() {
    let out = kvsched(&["bench", "--help"]);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("µs per iteration"), "{stdout}");
    assert!(!stdout.contains(" ns per iteration"), "{stdout}");

    let out = kvsched(&["bench", "S9"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2));
    for name in ["S1-64", "S4", "S7", "churn", "all"] {
        assert!(stderr.contains(name), "{name} missing: {stderr}");
    }

    // S4's outcome names its resumes and loads: it is the last column, the others stay aligned.
    let out = kvsched(&["bench", "S4", "--iters", "2"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let mut lines = stdout.lines();
    let (header, row) = (lines.next().unwrap(), lines.next().unwrap());
    let at = header.find("outcome").unwrap();
    let width = header[..at].chars().count();
    let row_prefix: String = row.chars().take(width).collect();
    assert!(row_prefix.ends_with("  "), "{header}\n{row}");
    assert!(row.contains("resumed 256"), "{row}");
    let cols = |s: &str| s.split_whitespace().count();
    assert_eq!(
        cols(&row_prefix),
        cols(&header[..at]) - 4,
        "{header}\n{row}"
    );
}

/// The depth family by name: a scenario runs, asserts its outcome and its skips, counts no allocation.
#[test]
fn bench_runs_a_depth_scenario_by_name() {
    let out = kvsched(&["bench", "depth-1k", "--iters", "2", "--json"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(v["scenario"], "depth-1k", "{stdout}");
    assert_eq!(v["outcome"], "64/0/0/0", "{stdout}");
    assert_eq!(v["skipped"], 1024, "{stdout}");
    assert_eq!(v["allocations"], 0, "{stdout}");
}
