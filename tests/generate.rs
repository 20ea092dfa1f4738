//! `kvsched generate` on the engine's test model: two prompts served batched, both completions and
//! the figures line printed; bad input refused with a one-line error and a non-zero status. Without
//! the model the test is skipped (printing the command that fetches it), except under CI (`CI` set),
//! where a missing model fails.

#[path = "support/cli.rs"]
mod cli;
use cli::{kvsched, tmp};

use std::io::Write;
use std::path::PathBuf;

/// The test model: `KVSCHED_MODEL`, else the fetch script's cache path.
fn model_path() -> Option<PathBuf> {
    let path = std::env::var_os("KVSCHED_MODEL").map_or_else(
        || {
            let cache = std::env::var_os("KVSCHED_MODEL_CACHE")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/kvsched/models"))
                })
                .unwrap_or_else(|| PathBuf::from(".cache/kvsched/models"));
            cache.join("SmolLM2-135M-Instruct.Q4_1.gguf")
        },
        PathBuf::from,
    );
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "the test model {} is missing (CI must run scripts/fetch-model.sh first)",
        path.display()
    );
    let _ = writeln!(std::io::stderr(), "skipped: run scripts/fetch-model.sh");
    None
}

fn text(out: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn two_prompts_are_served_and_the_figures_printed() {
    let Some(model) = model_path() else {
        return;
    };
    let model = model.to_str().unwrap();
    let out = kvsched(&[
        "generate",
        "--model",
        model,
        "--max-new-tokens",
        "12",
        "What is the capital of France?",
        "Name a colour of the sky.",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let first = stdout.find("--- 1: What is the capital of France?\n");
    let second = stdout.find("--- 2: Name a colour of the sky.\n");
    assert!(
        matches!((first, second), (Some(a), Some(b)) if a < b),
        "{stdout}"
    );
    assert!(stdout.contains("Paris"), "{stdout}");
    let figures = stdout.lines().last().unwrap();
    for part in [
        "requests 2,",
        "generated tokens ",
        "tok/s",
        "steps ",
        "suspensions ",
        "prefix-hit tokens ",
        "adapter loads 0",
        "% of step time",
    ] {
        assert!(figures.contains(part), "{part:?} missing: {figures}");
    }
}

#[test]
fn an_adapter_is_loaded_and_applied() {
    let Some(model) = model_path() else {
        return;
    };
    let model = model.to_str().unwrap();
    let prompts = tmp("prompts.txt");
    std::fs::write(&prompts, "Tell me about cats.\n\nTell me about dogs.\n").unwrap();
    let out = kvsched(&[
        "generate",
        "--model",
        model,
        "--max-new-tokens",
        "4",
        "--adapter",
        "7",
        "--prompts-file",
        prompts.to_str().unwrap(),
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("--- 2: Tell me about dogs."), "{stdout}");
    assert!(stdout.contains("requests 2,"), "{stdout}");
    assert!(!stdout.contains("adapter loads 0,"), "{stdout}");
}

#[test]
fn bad_input_is_one_line_and_a_failure() {
    let missing = tmp("no-such-model.gguf");
    let out = kvsched(&["generate", "--model", missing.to_str().unwrap(), "hello"]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("no-such-model.gguf"), "{stderr}");
    let out = kvsched(&["generate", "--model", missing.to_str().unwrap(), "hi", " "]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert_eq!(stderr.trim(), "kvsched generate: prompt 2 is empty");
    let Some(model) = model_path() else {
        return;
    };
    let long = "word ".repeat(3000);
    let out = kvsched(&["generate", "--model", model.to_str().unwrap(), &long]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("exceed the limit of 2048 tokens"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
