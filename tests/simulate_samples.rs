//! `kvsched simulate --samples N` (issue 44): every request's other samples are forked off it once
//! its prompt is computed, sharing its full pages; the report counts the forks and the pages they
//! shared, `--check` holds every invariant, and a run that cannot fork is refused before it starts.

#[path = "support/cli.rs"]
mod cli;
use cli::{kvsched, tmp};

fn report(name: &str, extra: &[&str]) -> serde_json::Value {
    let root = env!("CARGO_MANIFEST_DIR");
    let trace = format!("{root}/tests/data/mooncake_conversation_head30.jsonl");
    let j = tmp(&format!("{name}.json"));
    let mut args = vec![
        "simulate",
        trace.as_str(),
        "--check",
        "--adapters",
        "0",
        "--kv-gpu-pages",
        "32768",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--json", j.to_str().unwrap()]);
    let out = kvsched(&args);
    assert!(
        out.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&j).unwrap()).unwrap()
}

#[test]
fn every_request_forks_its_samples_on_its_pages() {
    let one = report("samples1", &[]);
    let four = report("samples4", &["--samples", "4"]);
    assert_eq!(four["invariant_violations"], 0);
    let requests = one["requests_completed"].as_u64().unwrap();
    assert_eq!(four["requests_completed"].as_u64(), Some(requests));
    assert_eq!(
        four["forks"].as_u64(),
        Some(3 * requests),
        "three forks a request"
    );
    assert_eq!(four["samples_completed"].as_u64(), Some(3 * requests));
    assert_eq!(four["fork_refused"], 0);
    // Each fork shares its prompt's full pages before its last token (32-token pages).
    let shared = four["fork_pages_shared"].as_u64().unwrap();
    let prompts = one["admitted_prompt_tokens"].as_u64().unwrap();
    assert!(
        shared * 32 > 2 * prompts,
        "{shared} pages shared for {prompts} prompt tokens"
    );
    // The samples decode: four times the output, and the prompts computed once.
    let tokens = |r: &serde_json::Value| r["tokens_generated"].as_u64().unwrap();
    assert_eq!(tokens(&four), 4 * tokens(&one));
    let prefill = |r: &serde_json::Value| r["prefill_tokens"].as_u64().unwrap();
    // A pool that holds every sample: no replay adds to the prefill.
    assert_eq!(
        (&four["recompute_paused"], &four["preempted"]),
        (&0.into(), &0.into())
    );
    assert!(
        prefill(&four) < prefill(&one) + requests * 3 * 32,
        "{} prefill tokens with forks, {} without: each fork computes only its last page",
        prefill(&four),
        prefill(&one)
    );
    eprintln!(
        "head30, 4 samples: {} forks sharing {shared} pages; prefill {} against {} for one sample",
        four["forks"],
        prefill(&four),
        prefill(&one)
    );
}

#[test]
fn a_run_that_cannot_fork_is_refused_before_it_starts() {
    let root = env!("CARGO_MANIFEST_DIR");
    let trace = format!("{root}/tests/data/mooncake_conversation_head30.jsonl");
    for extra in [
        &["--samples", "4", "--no-prefix-reuse"][..],
        &["--samples", "0"],
    ] {
        let mut args = vec!["simulate", trace.as_str(), "--kv-gpu-pages", "8192"];
        args.extend_from_slice(extra);
        let out = kvsched(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("--samples"),
            "{extra:?}: {err}"
        );
    }
}
