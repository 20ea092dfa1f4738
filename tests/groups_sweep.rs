//! End-to-end tests of `kvsched groups-sweep`: a small sweep prints its table, grouped running more
//! requests at once than full-only beyond the window; bad flags are refused with status 2.

#[path = "support/cli.rs"]
#[allow(dead_code)] // its `tmp` serves the other tests
mod cli;
use cli::kvsched;

#[test]
fn a_small_sweep_prints_the_table() {
    let out = kvsched(&[
        "groups-sweep",
        "--contexts",
        "1024,8192",
        "--requests",
        "24",
        "--output-tokens",
        "64",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.starts_with("kvsched groups-sweep: gemma3-27b (62 layers, 10 global, window 1024)"),
        "{text}"
    );
    let row = |context: &str| -> Vec<String> {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("| {context} |")))
            .unwrap_or_else(|| panic!("no row {context}: {text}"));
        line.split('|').map(|c| c.trim().to_owned()).collect()
    };
    // Column 3: requests that fit, full-only / grouped.
    let fits = |context: &str| -> (u32, u32) {
        let cell = row(context)[3].clone();
        let (f, g) = cell.split_once(" / ").expect("two figures");
        (f.parse().expect("a count"), g.parse().expect("a count"))
    };
    let (f, g) = fits("1024");
    assert_eq!(f, g, "{text}");
    let (f, g) = fits("8192");
    assert!(g > 3 * f, "{text}");
}

#[test]
fn bad_flags_are_refused() {
    for (args, says) in [
        (&["groups-sweep", "--model", "llama"][..], "unknown model"),
        (
            &["groups-sweep", "--contexts", "4096,1024"][..],
            "--contexts must ascend",
        ),
        (&["groups-sweep", "--contexts", "100"][..], "must exceed"),
    ] {
        let out = kvsched(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let out = kvsched(&["groups-sweep", "--help"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("--slo-tpot-ms"));
}

#[test]
fn simulate_runs_on_kv_groups_and_words_their_refusals_by_flag() {
    let out = kvsched(&[
        "simulate",
        "--limit",
        "60",
        "--kv-gpu-pages",
        "4000",
        "--kv-groups",
        "1024:4000",
        "--check",
        "--no-progress",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("60 of 60"), "{text}");
    for (extra, says) in [
        (&["--kv-groups", "1000:4000"][..], "--tokens-per-block (32)"),
        (&["--kv-groups", "1024:8"][..], "raise PAGES"),
        (&["--kv-groups", "1024"][..], "WINDOW:PAGES"),
    ] {
        let out = kvsched(&[&["simulate", "--limit", "10"][..], extra].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?}");
        assert!(err.contains(says), "{extra:?}: {err}");
    }
}
