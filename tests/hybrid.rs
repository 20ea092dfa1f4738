//! End-to-end tests of hybrid recurrent models in the simulator (`kvsched simulate --hybrid-preset`,
//! `kvsched hybrid-sweep`): prefix reuse on a hybrid needs snapshots; the hybrid runs more requests
//! at once than its full-attention twin at long prompts on the same bytes; bad state settings are
//! one-line errors with status 2.

#[path = "support/cli.rs"]
mod cli;
#[path = "support/simulated.rs"]
mod simulated;
use cli::kvsched;
use simulated::simulated;

/// The Mooncake conversation slice (30 requests with prefix blocks), on Nemotron-H 8B's preset.
const HYBRID: [&str; 6] = [
    "tests/data/mooncake_conversation_head30.jsonl",
    "--hybrid-preset",
    "nemotron-h-8b",
    "--adapters",
    "0",
    "--no-progress",
];

fn hit_rate(j: &serde_json::Value) -> f64 {
    j["prefix_hit_rate"].as_f64().expect("a hit rate")
}

#[test]
fn a_hybrid_reuses_prefixes_only_from_snapshots() {
    let with = simulated("hybrid-snapshots", &[&HYBRID[..], &["--check"]].concat());
    assert_eq!(with["requests_completed"], 30);
    assert_eq!(with["invariant_violations"], 0);
    let h = &with["hybrid"];
    assert_eq!(h["model"], "nemotron-h-8b");
    assert_eq!(h["state_bytes"], 51_806_208);
    assert_eq!(h["sizing"]["snapshot_slots"], 64);
    assert!(h["snapshot_hits"].as_u64().unwrap() > 0, "{h}");
    assert!(hit_rate(&with) > 0.0, "{with}");

    let none = simulated(
        "hybrid-no-snapshots",
        &[&HYBRID[..], &["--state-snapshots", "0"]].concat(),
    );
    assert_eq!(none["requests_completed"], 30);
    assert_eq!(hit_rate(&none), 0.0);
    assert_eq!(none["hybrid"]["snapshots"], 0);

    // The twin's prefix cache needs no snapshot.
    let full = simulated(
        "hybrid-twin",
        &[&HYBRID[..], &["--hybrid-layout", "full-attention"]].concat(),
    );
    assert_eq!(full["hybrid"]["sizing"]["layout"], "full-attention");
    assert!(hit_rate(&full) > 0.0, "{full}");
}

#[test]
fn the_table_shows_the_state_pool() {
    let out = kvsched(&[&["simulate"][..], &HYBRID].concat());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for says in [
        "nemotron-h-8b / hybrid",
        "scaled to nemotron-h-8b hybrid",
        "GPU (64 for snapshots, 51.8 MB each)",
        "snapshots ready / hits / evicted",
    ] {
        assert!(text.contains(says), "{says}: {text}");
    }
}

/// Column `col` of the sweep's row for prompt `prompt`, as (full, hybrid).
fn cell(text: &str, prompt: &str, col: usize) -> (u32, u32) {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("| {prompt} |")))
        .unwrap_or_else(|| panic!("no row {prompt}: {text}"));
    let cells: Vec<&str> = line.split('|').map(str::trim).collect();
    let (f, h) = cells[col].split_once(" / ").expect("two figures");
    (f.parse().expect("a count"), h.parse().expect("a count"))
}

#[test]
fn a_hybrid_runs_more_requests_at_once_than_full_attention_at_long_prompts() {
    let out = kvsched(&[
        "hybrid-sweep",
        "--prompts",
        "1024,32768",
        "--requests",
        "48",
        "--output-tokens",
        "1024",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.starts_with(
            "kvsched hybrid-sweep: nemotron-h-8b (52 layers: 4 attention, 24 Mamba-2;"
        ),
        "{text}"
    );
    // Column 3: requests that fit; column 4: the burst's peak running batch.
    let (f, h) = cell(&text, "1024", 4);
    assert_eq!((f, h), (48, 48), "{text}");
    let (f, h) = cell(&text, "32768", 3);
    assert!(h > 5 * f, "{text}");
    let (f, h) = cell(&text, "32768", 4);
    assert!(f < 48 && h == 48, "{text}");
}

#[test]
fn bad_hybrid_settings_are_one_line_errors() {
    for (extra, says) in [
        (
            &["--state-gpu-slots", "4", "--state-snapshots", "4"][..],
            "snapshots must leave at least one GPU state slot",
        ),
        (
            &["--snapshot-interval", "48"][..],
            "a snapshot interval must be a whole number of attention blocks",
        ),
        (&["--state-gpu-slots", "0"][..], "at least one GPU slot"),
        (&["--kv-gpu-pages", "10"][..], "raise --kv-gpu-pages"),
        (&["--samples", "2"][..], "does not support samples"),
    ] {
        let out = kvsched(&[&["simulate"][..], &HYBRID, extra].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(says), "{extra:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{extra:?}: {err}");
        assert!(!err.contains("panicked"), "{extra:?}: {err}");
    }
    for (args, says) in [
        (
            &["simulate", "--hybrid-preset", "mamba"][..],
            "unknown hybrid model",
        ),
        (
            &["simulate", "--state-snapshots", "3"][..],
            "--hybrid-preset",
        ),
        (
            &["hybrid-sweep", "--prompts", "4096,1024"][..],
            "--prompts must ascend",
        ),
        (
            &["hybrid-sweep", "--prompts", "200000"][..],
            "at most the model's",
        ),
    ] {
        let out = kvsched(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
