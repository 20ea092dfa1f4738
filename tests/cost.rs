//! `kvsched cost` and the simulator's cost presets: the H200 preset reproduces every measured step
//! within the stated errors, predictions compose, and bad input is refused with the option named.

#[path = "support/cli.rs"]
mod cli;
use cli::{kvsched, tmp};

fn points() -> Vec<String> {
    let root = env!("CARGO_MANIFEST_DIR");
    [
        "llama3-8b-steps.jsonl",
        "llama3-8b-mixed-steps.jsonl",
        "llama3-8b-decode-graphs.jsonl",
    ]
    .iter()
    .map(|f| format!("{root}/data/measurements/h200/{f}"))
    .collect()
}

#[test]
fn the_h200_preset_reproduces_every_measured_step() {
    let files = points();
    let mut args = vec!["cost", "--json", "--points"];
    args.extend(files.iter().map(String::as_str));
    let out = kvsched(&args);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["points"].as_array().unwrap().len(), 47);
    let (median, max) = (
        v["median_error"].as_f64().unwrap(),
        v["max_error"].as_f64().unwrap(),
    );
    assert!(median <= 0.10 && max <= 0.25, "median {median}, max {max}");
    // The first model's constants miss them badly: a decode step costs the same at any context.
    let mut legacy = vec!["cost", "--engine", "legacy", "--json", "--points"];
    legacy.extend(files.iter().map(String::as_str));
    let out = kvsched(&legacy);
    assert!(!out.status.success(), "the legacy model misses the targets");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["max_error"].as_f64().unwrap() > 0.5);
}

#[test]
fn a_step_prediction_adds_its_terms() {
    let ms = |args: &[&str]| -> f64 {
        let mut all = vec!["cost", "--json"];
        all.extend_from_slice(args);
        let out = kvsched(&all);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["step_ms"].as_f64().unwrap()
    };
    let floor = ms(&[]);
    let decode = ms(&["--decode", "256:8192"]);
    let chunk = ms(&["--prefill", "2048:8192"]);
    let both = ms(&["--decode", "256:8192", "--prefill", "2048:8192"]);
    assert!(
        (both - (decode + chunk - floor)).abs() < 1e-9,
        "one floor per step"
    );
    // Measured 68.88 ms (CUDA graph).
    assert!((decode - 68.88).abs() / 68.88 < 0.05, "{decode}");
    assert!(
        ms(&["--decode", "256:512"]) < decode / 4.0,
        "attention grows with context"
    );
    assert!(ms(&["--prefill", "512:4096", "--masked"]) > ms(&["--prefill", "512:4096"]));
    // The command's own options come first, then the cost model's group under its heading.
    let help = kvsched(&["cost", "--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    let at = |s: &str| text.find(s).unwrap_or_else(|| panic!("{s} in {text}"));
    assert!(
        at("--decode") < at("Cost model") && at("Cost model") < at("--step-us"),
        "{text}"
    );
    // A term given on the command line replaces the preset's: 1 ms more of floor is 1 ms more a step.
    let floor_us = 1000.0 + 4319.09;
    let raised = ms(&["--decode", "256:8192", "--step-us", &floor_us.to_string()]);
    assert!((raised - decode - 1.0).abs() < 1e-6, "{raised} {decode}");
    for (bad, says) in [
        (&["cost", "--step-us", "inf"][..], "--step-us"),
        (&["cost", "--engine", "h100"], "legacy|h200-llama3-8b"),
        (&["cost", "--decode", "4"], "BATCH:CONTEXT"),
        (&["cost", "--prefill", "x"], "--prefill"),
        (&["cost", "--bogus"], "unexpected argument"),
    ] {
        let out = kvsched(bad);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(err.contains(says), "{bad:?}: {err}");
    }
}

#[test]
fn the_simulator_runs_on_the_measured_preset() {
    let root = env!("CARGO_MANIFEST_DIR");
    let trace = format!("{root}/tests/data/burstgpt1_head54.csv");
    let run = |engine: &str, extra: &[&str]| {
        let j = tmp(&format!("cost-{engine}.json"));
        let mut args = vec![
            "simulate",
            &trace,
            "--no-progress",
            "--kv-gpu-pages",
            "2048",
            "--engine",
            engine,
            "--json",
            j.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let out = kvsched(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(j).unwrap()).unwrap()
    };
    let h200 = run("h200-llama3-8b", &["--check"]);
    let legacy = run("legacy", &[]);
    assert_eq!(h200["engine"], "h200-llama3-8b");
    assert_eq!(legacy["engine"], "legacy");
    assert_eq!(h200["invariant_violations"], 0);
    assert_eq!(h200["tokens_generated"], legacy["tokens_generated"]);
    // BurstGPT's head runs one request at a time: a decode step is the floor plus one request.
    let tpot = |r: &serde_json::Value| r["tpot_ms"]["p50"].as_f64().unwrap();
    assert!((tpot(&h200) - 4.35).abs() < 0.3, "TPOT {}", tpot(&h200));
    assert!((tpot(&legacy) - 6.04).abs() < 0.1, "TPOT {}", tpot(&legacy));
    // A term given on the command line overrides the preset's, before or after --engine.
    let slow = run("h200-llama3-8b", &["--step-us", "10000"]);
    assert!(tpot(&slow) > 10.0);
    assert_eq!(slow["engine"], "h200-llama3-8b (terms overridden)");
    let out = kvsched(&["simulate", &trace, "--attention-us-per-pair", "-1"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--attention-us-per-pair"));
}

/// `--fit` prints the flags of the terms it fitted; fed back to `--points`, they reproduce the fit's
/// errors, and they are no worse than the preset's on the points they were fitted to.
#[test]
fn a_fit_prints_flags_that_reproduce_it() {
    let files = points();
    let mut args = vec!["cost", "--fit"];
    args.extend(files.iter().map(String::as_str));
    let out = kvsched(&args);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let flags: Vec<&str> = text.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(flags.len(), 10, "five terms as flags: {flags:?}");
    assert_eq!(flags[0], "--step-us");
    let median = |extra: &[&str]| -> f64 {
        let mut a = vec!["cost", "--json"];
        a.extend_from_slice(extra);
        a.push("--points");
        a.extend(files.iter().map(String::as_str));
        let out = kvsched(&a);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["median_error"].as_f64().unwrap()
    };
    let (fitted, preset) = (median(&flags), median(&[]));
    assert!(fitted <= 0.10, "fitted median error {fitted}");
    assert!(
        (fitted - preset).abs() < 0.01,
        "fitted {fitted}, preset {preset}"
    );
    // Too few points to fit five terms: refused, naming the option.
    let few = tmp("few.jsonl");
    std::fs::write(
        &few,
        "{\"kind\":\"prefill\",\"tokens\":64,\"ms_median\":20.0}\n",
    )
    .unwrap();
    let out = kvsched(&["cost", "--fit", few.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--fit: 1 fittable points for 5 terms"),
        "{err}"
    );
}

/// The CPU preset is the fit of the CPU engine's measured steps: it reproduces them within the
/// targets, and fitting them again gives its terms back.
#[test]
fn the_cpu_preset_is_the_fit_of_the_cpu_engines_steps() {
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/measurements/cpu/smollm2-135m-steps.jsonl"
    );
    let out = kvsched(&[
        "cost",
        "--engine",
        "cpu-smollm2-135m",
        "--json",
        "--points",
        file,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["points"].as_array().unwrap().len() >= 14);
    let (median, max) = (
        v["median_error"].as_f64().unwrap(),
        v["max_error"].as_f64().unwrap(),
    );
    assert!(median <= 0.10 && max <= 0.25, "median {median}, max {max}");
    let out = kvsched(&["cost", "--fit", file]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let flags: Vec<&str> = text.lines().next().unwrap().split_whitespace().collect();
    let preset = kvsched_sim::CostModel::cpu_smollm2_135m(16);
    let terms = [
        preset.step_us,
        preset.prefill_us_per_token,
        preset.decode_us_per_request,
        preset.decode_us_per_cached_token,
        preset.attention_us_per_pair,
    ];
    for (pair, want) in flags.chunks(2).zip(terms) {
        let got: f64 = pair[1].parse().unwrap();
        assert!(
            (got - want).abs() <= 1e-4 * want,
            "{} {got}, preset {want}",
            pair[0]
        );
    }
}
