//! End-to-end checks of the workload crate through its public API: every shipped trace loads by format
//! sniffing, adapters and ranks are assigned, and no reader panics on arbitrary or mutated text.

use std::path::{Path, PathBuf};

use kvsched_workload::popularity::{assign_adapters, pages_for_rank, AdapterRanks, AdapterSampler};
use kvsched_workload::{load, load_as, parse, Source, TraceErrorKind, TraceFormat, Workload};
use proptest::prelude::*;

/// A path from the repository root (the shipped traces live there, beside the binary's tests).
fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

fn format_of(w: &Workload) -> Option<TraceFormat> {
    match &w.source {
        Source::Trace { format, .. } => Some(*format),
        Source::Synthetic(_) => None,
    }
}

#[test]
fn shipped_traces_load_by_sniffing() {
    let cases = [
        ("data/azure_conv_head.csv", TraceFormat::Azure2023, 1500, 0),
        (
            "tests/data/mooncake_conversation_head30.jsonl",
            TraceFormat::Mooncake,
            30,
            0,
        ),
        (
            "tests/data/burstgpt1_head54.csv",
            TraceFormat::BurstGpt,
            51,
            3,
        ),
    ];
    for (rel, format, rows, dropped) in cases {
        let w = load(repo(rel)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(format_of(&w), Some(format), "{rel}");
        assert_eq!((w.len(), w.dropped_rows), (rows, dropped), "{rel}");
        assert!(
            w.arrivals.windows(2).all(|p| p[0].at_ms <= p[1].at_ms),
            "{rel} not sorted"
        );
        assert!(w
            .arrivals
            .iter()
            .all(|a| a.at_ms >= 0.0 && a.prompt_tokens > 0 && a.output_tokens > 0));
        // Forcing the right format gives the same result; forcing a wrong one is a header/JSON error.
        assert_eq!(load_as(repo(rel), format).unwrap(), w);
        let wrong = if format == TraceFormat::Azure2023 {
            TraceFormat::BurstGpt
        } else {
            TraceFormat::Azure2023
        };
        let err = load_as(repo(rel), wrong).unwrap_err();
        assert_eq!(err.line, Some(1), "{err}");
        assert!(
            matches!(err.reason, TraceErrorKind::BadHeader { .. }),
            "{err}"
        );
    }
}

/// The full traces in the project's shared folder, when it is present (it is not part of the repository):
/// row counts and spans from its README.
#[test]
fn full_shared_traces_match_their_documented_statistics() {
    let dir = repo("../shared/traces");
    if !dir.is_dir() {
        eprintln!("skipped: {} not present", dir.display());
        return;
    }
    let cases = [
        (
            "azure2023_AzureLLMInferenceTrace_conv.csv",
            19_366,
            3_501_700.0,
            100.0,
        ),
        (
            "azure2023_AzureLLMInferenceTrace_code.csv",
            8_819,
            3_435_900.0,
            100.0,
        ),
        (
            "mooncake_fast25_conversation_trace.jsonl",
            12_031,
            3_536_999.0,
            0.0,
        ),
        (
            "mooncake_fast25_synthetic_trace.jsonl",
            3_993,
            1_022_025.0,
            0.0,
        ),
    ];
    for (name, rows, span_ms, tol_ms) in cases {
        let w = load(dir.join(name)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(w.len(), rows, "{name}");
        assert_eq!(w.dropped_rows, 0, "{name}");
        assert!(
            (w.span_ms() - span_ms).abs() <= tol_ms,
            "{name}: span {}",
            w.span_ms()
        );
    }
    let mc = load(dir.join("mooncake_fast25_conversation_trace.jsonl")).unwrap();
    let refs: usize = mc.arrivals.iter().map(|a| a.prefix_blocks.len()).sum();
    assert_eq!(refs, 288_500);
}

#[test]
fn adapters_and_ranks_can_be_layered_on_a_trace() {
    let mut w = load(repo("data/azure_conv_head.csv")).unwrap();
    let sampler = AdapterSampler::new("power:0.3".parse().unwrap(), 100).unwrap();
    assign_adapters(&mut w.arrivals, &sampler, 1);
    let ranks: AdapterRanks = "64,32,16,8".parse().unwrap();
    let pages: Vec<u64> = w
        .arrivals
        .iter()
        .map(|a| pages_for_rank(ranks.rank_of(a.adapter.unwrap()), 4))
        .collect();
    assert!(pages.iter().all(|&p| [32, 16, 8, 4].contains(&p)));
    // alpha 0.3 favours low ids: adapter 0 alone takes (1/100)^0.3 ≈ 25% of requests.
    let zeros = w.arrivals.iter().filter(|a| a.adapter == Some(0)).count();
    assert!((300..450).contains(&zeros), "{zeros}");
}

const FORMATS: [Option<TraceFormat>; 4] = [
    None,
    Some(TraceFormat::Azure2023),
    Some(TraceFormat::Mooncake),
    Some(TraceFormat::BurstGpt),
];

/// Any error must point at a line that exists (or at the whole file) and print as `path...: reason`.
fn check_outcome(text: &str, format: Option<TraceFormat>) {
    match parse(text, Path::new("fuzz.txt"), format) {
        Ok(w) => assert!(w.arrivals.windows(2).all(|p| p[0].at_ms <= p[1].at_ms)),
        Err(e) => {
            let lines = text.matches('\n').count() + 1;
            assert!(
                e.line.is_none_or(|l| (1..=lines).contains(&l)),
                "{e} (text has {lines} lines)"
            );
            assert!(e.to_string().starts_with("fuzz.txt"), "{e}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn readers_never_panic_on_arbitrary_text(text in "(?s).{0,300}", f in 0usize..4) {
        check_outcome(&text, FORMATS[f]);
    }

    #[test]
    fn readers_never_panic_on_mutated_real_rows(
        which in 0usize..3,
        edits in prop::collection::vec((any::<prop::sample::Index>(), prop::sample::select(vec![
            "", ",", "\n", "\r\n", "{", "}", "[", "]", "\"", "-", "9", "99999999999", ":", " ", ".", "e", "\u{e9}",
        ])), 1..4),
        f in 0usize..4,
    ) {
        let file = ["data/azure_conv_head.csv", "tests/data/mooncake_conversation_head30.jsonl",
            "tests/data/burstgpt1_head54.csv"][which];
        let full = std::fs::read_to_string(repo(file)).unwrap();
        // The first few rows are enough, and keep each case fast.
        let mut text: String = full.split_inclusive('\n').take(6).collect();
        for (at, with) in edits {
            let mut cut = at.index(text.len() + 1);
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            // Replace one character (or insert at the end).
            let end = text[cut..].chars().next().map_or(cut, |c| cut + c.len_utf8());
            text.replace_range(cut..end, with);
        }
        check_outcome(&text, FORMATS[f]);
    }
}
