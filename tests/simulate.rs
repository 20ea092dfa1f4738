//! End-to-end tests of `kvsched simulate`: the replay's report is consistent, bad input is refused
//! before the run with a message that says what to change, and output files are written whole.

#[path = "support/cli.rs"]
mod cli;
#[path = "support/simulated.rs"]
mod simulated;
use cli::{kvsched, tmp};
use simulated::{json, simulated};

#[test]
fn default_replay_is_consistent_and_checked() {
    let j = tmp("default.json");
    let svg = tmp("default.svg");
    let out = kvsched(&[
        "simulate",
        "--check",
        "--no-progress",
        "--adapters",
        "16",
        "--kv-gpu-pages",
        "512",
        "--kv-host-pages",
        "2048",
        "--json",
        j.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("requests completed"), "{stdout}");
    let r = json(&j);
    assert_eq!(
        r["requests_completed"], 1500,
        "every request of the shipped slice completes"
    );
    assert_eq!(
        r["tokens_generated"], r["completed_output_tokens"],
        "tokens generated = the trace's output tokens"
    );
    assert_eq!(r["invariant_violations"], 0);
    for k in ["ttft_ms", "tpot_ms", "sched_ns_per_iter"] {
        assert!(
            r[k]["p50"].as_f64().unwrap() <= r[k]["p99"].as_f64().unwrap(),
            "{k}"
        );
    }
    assert!(
        r["suspended"].as_u64().unwrap() > 0,
        "this pool size puts the scheduler under pressure"
    );
    assert!(r["adapter_loads"].as_u64().unwrap() > 0);
    assert!(r["iterations"].as_u64().unwrap() > 1000);
    assert!(
        r["prefix_hit_rate"].as_f64().unwrap() > 0.1,
        "the conversation generator's system prompts and sessions are reused"
    );
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(
        svg.starts_with("<svg")
            && svg.contains("GPU KV pool")
            && svg.contains("host KV pool")
            && svg.contains("held by requests")
            && svg.contains("prefix cache")
            && svg.contains("adapters")
    );
}

/// Mooncake `hash_ids` drive reuse; `--no-prefix-reuse` turns it off for the comparison.
#[test]
fn prefix_reuse_follows_the_trace_and_saves_prefill() {
    let root = env!("CARGO_MANIFEST_DIR");
    let trace = format!("{root}/tests/data/mooncake_conversation_head30.jsonl");
    let run = |extra: &[&str]| {
        let base = [
            trace.as_str(),
            "--check",
            "--adapters",
            "0",
            "--kv-gpu-pages",
            "8192",
        ];
        simulated(
            &format!("mooncake{}", extra.len()),
            &[&base[..], extra].concat(),
        )
    };
    let on = run(&[]);
    let off = run(&["--no-prefix-reuse"]);
    assert_eq!(on["invariant_violations"], 0);
    assert_eq!(on["prefix_reuse"], true);
    assert_eq!(off["prefix_reuse"], false);
    // The head's ceiling: each prompt's run of hash_ids already seen earlier, 512 tokens a block, capped
    // at its length, is 14,848 of its 424,999 prompt tokens; with a pool that evicts nothing the
    // replay reuses all of it (no reused run ends on a prompt's last token here).
    assert_eq!(on["admitted_prompt_tokens"], 424_999);
    assert_eq!(on["admitted_reused_tokens"], 14_848);
    assert_eq!(off["prefix_hit_rate"].as_f64(), Some(0.0));
    assert_eq!(off["prefill_tokens_saved"], 0);
    let (p_on, p_off) = (
        on["prefill_tokens"].as_u64().unwrap(),
        off["prefill_tokens"].as_u64().unwrap(),
    );
    assert!(p_on < p_off, "prefill {p_on} with reuse, {p_off} without");
    assert_eq!(
        on["admitted_prompt_tokens"], off["admitted_prompt_tokens"],
        "the same prompts were admitted"
    );
    // Pages that do not nest with the trace's 512-token blocks are refused before the run.
    let out = kvsched(&[
        "simulate",
        &trace,
        "--tokens-per-block",
        "48",
        "--kv-gpu-pages",
        "8192",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("512-token prefix blocks"),
        "{err}"
    );
}

#[test]
fn every_shipped_trace_format_replays_with_zero_violations() {
    let root = env!("CARGO_MANIFEST_DIR");
    for (f, paging) in [
        "tests/data/mooncake_conversation_head30.jsonl",
        "tests/data/burstgpt1_head54.csv",
    ]
    .into_iter()
    .flat_map(|f| [(f, "split"), (f, "unified")])
    {
        let p = format!("{root}/{f}");
        let name = format!("{}-{paging}", f.replace('/', "_"));
        let args = [
            "--check",
            "--kv-gpu-pages",
            "8192",
            "--adapter-paging",
            paging,
        ];
        let r = simulated(&name, &[&[p.as_str()][..], &args[..]].concat());
        assert_eq!(r["invariant_violations"], 0, "{f}");
        assert_eq!(r["requests_completed"], r["requests_total"], "{f}");
        assert_eq!(r["tokens_generated"], r["completed_output_tokens"], "{f}");
    }
}

#[test]
fn every_slice_in_data_runs_with_default_options() {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut slices: Vec<String> = std::fs::read_dir(format!("{root}/data"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("csv" | "jsonl")
            )
        })
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    slices.sort();
    assert_eq!(slices.len(), 5, "{slices:?}");
    for p in &slices {
        let r = simulated("slice", &[p.as_str(), "--no-progress"]);
        assert_eq!(r["engine"], "h200-llama3-8b");
        assert_eq!(r["requests_completed"], r["requests_total"], "{p}");
        assert_eq!(r["tokens_generated"], r["completed_output_tokens"], "{p}");
        // The Mooncake slices arrive faster than one engine serves them, and the report says so.
        assert_eq!(r["overloaded"], p.contains("mooncake"), "{p}");
        // The starvation figure is finite: every request ran again until it finished.
        let s = &r["starvation"];
        assert_eq!(s["unfinished"], 0, "{p}: {s}");
        assert!(s["overtaken"].as_u64() <= s["passes"].as_u64(), "{p}: {s}");
        assert!(s["passes"].as_u64() < r["iterations"].as_u64(), "{p}: {s}");
    }
}

#[test]
fn a_malformed_trace_line_names_file_and_line_and_writes_nothing() {
    let bad = tmp("bad.csv");
    std::fs::write(&bad, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,abc,12\n").unwrap();
    let j = tmp("bad.json");
    let out = kvsched(&[
        "simulate",
        bad.to_str().unwrap(),
        "--json",
        j.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("bad.csv:3") && err.contains("ContextTokens"),
        "{err}"
    );
    assert!(!j.exists(), "no output file on a refused run");
}

#[test]
fn options_that_cannot_work_are_refused_before_the_run() {
    let out = kvsched(&["simulate", "--kv-gpu-pages", "16"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("longer than the whole KV pool") && err.contains("--kv-gpu-pages"),
        "{err}"
    );
    let out = kvsched(&[
        "simulate",
        "--adapters",
        "4",
        "--ranks",
        "64",
        "--adapter-device-pages",
        "8",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("adapter 0") && err.contains("--adapter-device-pages"),
        "{err}"
    );
    let out = kvsched(&["simulate", "--max-batch", "x"]);
    assert_eq!(out.status.code(), Some(2));
    let out = kvsched(&["simulate", "--bogus"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unexpected argument '--bogus'"));
    // Help is not an error: stdout, status 0, every option with its default.
    let out = kvsched(&["simulate", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    assert!(
        help.contains("--kv-host-pages") && help.contains("[default: 4096]"),
        "{help}"
    );
}

#[test]
fn speculative_decoding_keeps_the_accepted_drafts_and_cuts_tpot() {
    let root = env!("CARGO_MANIFEST_DIR");
    let trace = format!("{root}/tests/data/burstgpt1_head54.csv");
    // `--check` audits every page of both pools after every iteration: on for the run with drafts.
    let run = |name: &str, extra: &[&str]| {
        let base = [trace.as_str(), "--no-progress", "--kv-gpu-pages", "2048"];
        let r = simulated(&format!("spec-{name}"), &[&base[..], extra].concat());
        let checked = extra.contains(&"--check");
        let violations = &r["invariant_violations"];
        assert!(
            if checked {
                *violations == 0
            } else {
                violations.is_null()
            },
            "{name}: {violations}"
        );
        assert_eq!(r["requests_completed"], r["requests_total"], "{name}");
        assert_eq!(
            r["tokens_generated"], r["completed_output_tokens"],
            "{name}: a step keeps 1 + its accepted drafts, never more than the request asks for"
        );
        r
    };
    let plain = run("plain", &[]);
    let spec = run("spec", &["--spec-decode", "4:0.7", "--check"]);
    let none = run("none", &["--spec-decode", "4:0"]);
    let all = run("all", &["--spec-decode", "4:1", "--draft-kv-pages", "2048"]);
    assert_eq!(plain["spec_drafts"], 0);
    assert_eq!(spec["spec_drafts"], 4);
    // Each draft is accepted with probability 0.7 after the ones before it: 0.7 + 0.7² + 0.7³ + 0.7⁴ =
    // 1.773 accepted a step in expectation (thousands of steps: the mean lands within 0.1).
    let accepted = spec["accepted_tokens_per_step"].as_f64().unwrap();
    assert!((accepted - 1.773).abs() < 0.1, "accepted {accepted}");
    assert_eq!(none["accepted_tokens_per_step"].as_f64(), Some(0.0));
    let every = all["accepted_tokens_per_step"].as_f64().unwrap();
    assert!(
        (3.5..=4.0).contains(&every),
        "all accepted: {every} (the last step of a request keeps only what it still needs)"
    );
    // Fewer steps for the same tokens: the time per output token falls.
    let tpot = |r: &serde_json::Value| r["tpot_ms"]["p50"].as_f64().unwrap();
    assert!(
        tpot(&spec) < 0.7 * tpot(&plain),
        "TPOT p50 {} with drafts, {} without",
        tpot(&spec),
        tpot(&plain)
    );
    let steps = |r: &serde_json::Value| r["decode_steps"].as_u64().unwrap();
    assert!(steps(&spec) < steps(&plain) && steps(&all) < steps(&spec));
    // Refused before the run: no drafts, an acceptance outside [0, 1], a draft pool too small.
    for bad in [
        &["--spec-decode", "0:0.5"][..],
        &["--spec-decode", "4:1.5"],
        &["--spec-decode", "4"],
        &["--spec-decode", "4:0.7", "--draft-kv-pages", "1"],
    ] {
        let mut args = vec!["simulate", &trace];
        args.extend_from_slice(bad);
        let out = kvsched(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success()
                && (err.contains("--spec-decode") || err.contains("--draft-kv-pages")),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn goodput_counts_the_requests_that_meet_both_objectives() {
    let root = env!("CARGO_MANIFEST_DIR");
    let trace = format!("{root}/tests/data/burstgpt1_head54.csv");
    let run = |name: &str, slo: &[&str]| {
        let base = [trace.as_str(), "--no-progress", "--kv-gpu-pages", "2048"];
        simulated(&format!("slo-{name}"), &[&base[..], slo].concat())
    };
    let f = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap();
    let loose = run("loose", &["--slo-ttft-ms", "1e9", "--slo-tpot-ms", "1e9"]);
    assert_eq!(f(&loose, "slo_attainment"), 1.0);
    let all = f(&loose, "requests_completed") / f(&loose, "sim_seconds");
    assert!((f(&loose, "goodput_rps") - all).abs() < 1e-9);
    let none = run("tight", &["--slo-ttft-ms", "0.001"]);
    assert_eq!(f(&none, "slo_attainment"), 0.0);
    assert_eq!(f(&none, "goodput_rps"), 0.0);
    assert_eq!(
        none["slo_tpot_ms"],
        serde_json::Value::Null,
        "unconstrained"
    );
    // At the median TTFT about half meet it (ties at the median count as met).
    let p50 = loose["ttft_ms"]["p50"].as_f64().unwrap();
    let half = run("median", &["--slo-ttft-ms", &p50.to_string()]);
    let share = f(&half, "slo_attainment");
    assert!((0.45..=0.75).contains(&share), "{share}");
    let out = kvsched(&["simulate", &trace, "--slo-tpot-ms", "0"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--slo-tpot-ms"));
}

#[test]
fn a_run_that_outruns_the_engine_says_so() {
    let run = |scale: &str| {
        let j = tmp(&format!("overload-{scale}.json"));
        let out = kvsched(&[
            "simulate",
            "--no-progress",
            "--engine",
            "h200-llama3-8b",
            "--time-scale",
            scale,
            "--json",
            j.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (String::from_utf8_lossy(&out.stdout).into_owned(), json(&j))
    };
    // The default slice's 310 s of arrivals squeezed into 6 s: the engine needs minutes for them.
    let (text, r) = run("0.02");
    assert_eq!(r["overloaded"], true, "{text}");
    assert!(
        text.contains("overloaded: arrivals outran the engine")
            && text.contains("--time-scale above"),
        "{text}"
    );
    let (text, r) = run("1");
    assert_eq!(r["overloaded"], false, "{text}");
    assert!(!text.contains("overloaded"));
}

#[test]
fn a_sweep_runs_every_value_and_draws_the_curve() {
    let root = env!("CARGO_MANIFEST_DIR");
    let trace = format!("{root}/tests/data/burstgpt1_head54.csv");
    let (j, svg) = (tmp("sweep.json"), tmp("sweep.svg"));
    let out = kvsched(&[
        "simulate",
        &trace,
        "--sweep",
        "rate=1,10,100",
        "--slo-ttft-ms",
        "100",
        "--kv-gpu-pages",
        "2048",
        "--json",
        j.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("| arrival-rate scale | throughput tok/s"),
        "{text}"
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("| 1")).count(),
        3,
        "{text}"
    );
    let runs = json(&j);
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 3);
    let f = |i: usize, k: &str| runs[i][k].as_f64().unwrap();
    for run in runs {
        assert_eq!(run["requests_completed"], run["requests_total"]);
    }
    // Denser arrivals: the same tokens in less simulated time.
    assert!(f(0, "throughput_tok_s") < f(1, "throughput_tok_s"));
    assert!(f(1, "throughput_tok_s") < f(2, "throughput_tok_s"));
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.contains("arrival-rate scale"));
    assert!(plot.contains("goodput"));
    let out = kvsched(&["simulate", &trace, "--sweep", "rate=2,1"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("ascend"));
}

#[test]
fn admission_policies_run_checked_and_report_per_adapter_service() {
    for policy in ["fcfs", "vtc", "deadline"] {
        let j = tmp(&format!("admission-{policy}.json"));
        let out = kvsched(&[
            "simulate",
            "--check",
            "--no-progress",
            "--limit",
            "120",
            "--time-scale",
            "0.5",
            "--adapters",
            "16",
            "--popularity",
            "zipf:1.2",
            "--admission",
            policy,
            "--drain-after",
            "16",
            // A small pool: --check audits every page every iteration.
            "--kv-gpu-pages",
            "1024",
            "--json",
            j.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("TTFT p99 best / worst adapter"), "{text}");
        let d = json(&j);
        assert_eq!(d["admission"], policy);
        assert_eq!(d["invariant_violations"], 0);
        assert_eq!(d["requests_completed"], 120);
        let per = d["per_adapter"].as_array().unwrap();
        let served: u64 = per.iter().map(|a| a["requests"].as_u64().unwrap()).sum();
        assert_eq!(served, 120, "every request's first token is counted once");
        let index = d["jain_fairness"].as_f64().unwrap();
        assert!(index > 0.0 && index <= 1.0, "{index}");
    }
    // A sweep over the policies puts them side by side, with the fairness columns.
    let out = kvsched(&[
        "simulate",
        "--no-progress",
        "--limit",
        "60",
        "--kv-gpu-pages",
        "1024",
        "--sweep",
        "admission=fcfs,vtc",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Jain's index"));
    let bad = kvsched(&["simulate", "--admission", "lottery"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown admission policy \"lottery\""));
}

#[test]
fn unified_paging_runs_checked_and_lends_the_kv_slack_to_adapters() {
    let run = |paging: &str| {
        let d = simulated(
            &format!("paging-{paging}"),
            &[
                "--check",
                "--no-progress",
                "--limit",
                "200",
                "--time-scale",
                "0.25",
                "--adapters",
                "32",
                "--pages-per-rank8",
                "4",
                // A small pool: --check audits every page every iteration.
                "--kv-gpu-pages",
                "2048",
                "--adapter-paging",
                paging,
            ],
        );
        assert_eq!(d["adapter_paging"], paging);
        assert_eq!(d["invariant_violations"], 0);
        assert_eq!(d["requests_completed"], 200);
        d
    };
    let (split, unified) = (run("split"), run("unified"));
    // 32 adapters of 4 to 32 pages do not fit a 64-page device cache; beside 2048 KV pages they stay
    // resident, so fewer loads and a shorter wait for the first token.
    let loads = |d: &serde_json::Value| d["adapter_loads"].as_u64().unwrap();
    assert!(
        loads(&unified) < loads(&split),
        "{} vs {}",
        loads(&unified),
        loads(&split)
    );
    let p99 = |d: &serde_json::Value| d["ttft_ms"]["p99"].as_f64().unwrap();
    assert!(p99(&unified) < p99(&split));
    // A request that cannot fit beside the largest adapter is refused before the run.
    let out = kvsched(&[
        "simulate",
        "--kv-gpu-pages",
        "200",
        "--adapter-device-pages",
        "8",
        "--adapter-paging",
        "unified",
        "--ranks",
        "64",
        "--pages-per-rank8",
        "8",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("does not fit beside the largest adapter"),
        "{err}"
    );
}

#[test]
fn replicas_behind_a_router_split_the_trace_and_report_the_cluster() {
    let root = env!("CARGO_MANIFEST_DIR");
    let trace = format!("{root}/tests/data/mooncake_conversation_head30.jsonl");
    let run = |route: &str| {
        simulated(
            &format!("cluster-{route}"),
            &[
                trace.as_str(),
                "--check",
                "--kv-gpu-pages",
                "8192",
                "--replicas",
                "4",
                "--route",
                route,
            ],
        )
    };
    for route in ["round_robin", "least_loaded", "prefix_affinity", "kv"] {
        let d = run(route);
        assert_eq!(d["route"], route);
        assert_eq!(d["invariant_violations"], 0);
        assert_eq!(d["requests_completed"], d["requests_total"]);
        let rows = d["replicas"].as_array().unwrap();
        assert_eq!(rows.len(), 4);
        let routed: u64 = rows.iter().map(|r| r["requests"].as_u64().unwrap()).sum();
        assert_eq!(
            routed,
            d["requests_total"].as_u64().unwrap(),
            "every request routed once"
        );
        // Deterministic for a seed (but for the scheduler's own measured time).
        let without_timing = |mut d: serde_json::Value| {
            d.as_object_mut().unwrap().remove("sched_ns_per_iter");
            d
        };
        assert_eq!(without_timing(d), without_timing(run(route)));
    }
    // Round robin deals the requests out evenly.
    let d = run("round_robin");
    let counts: Vec<u64> = d["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["requests"].as_u64().unwrap())
        .collect();
    assert!(
        counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1,
        "{counts:?}"
    );
    // One engine's report has no cluster fields.
    let one = simulated("cluster-one", &[trace.as_str(), "--kv-gpu-pages", "8192"]);
    assert!(one.get("replicas").is_none() && one.get("route").is_none());
    let bad = kvsched(&["simulate", "--replicas", "0"]);
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn the_kv_aware_router_sends_prompts_where_their_prefix_is_cached() {
    // The shipped head of the Mooncake synthetic trace (300 requests that share long prefixes), on
    // four replicas: the router fed by the replicas' KV events finds more of each prompt cached than
    // turns and load do, and its requests wait less for their first token.
    let root = env!("CARGO_MANIFEST_DIR");
    let trace = format!("{root}/data/mooncake_synthetic_head.jsonl");
    let run = |route: &str, weight: &str| {
        simulated(
            &format!("kv-route-{route}-{weight}"),
            &[
                trace.as_str(),
                "--adapters",
                "0",
                "--replicas",
                "4",
                "--route",
                route,
                "--kv-overlap-weight",
                weight,
            ],
        )
    };
    let hit = |d: &serde_json::Value| d["prefix_hit_rate"].as_f64().unwrap();
    let ttft = |d: &serde_json::Value, q: &str| d["ttft_ms"][q].as_f64().unwrap();
    let kv = run("kv", "1");
    assert_eq!(kv["route"], "kv");
    assert_eq!(kv["requests_completed"], kv["requests_total"]);
    for other in ["round_robin", "least_loaded"] {
        let d = run(other, "1");
        assert!(hit(&kv) > hit(&d), "{other}: {} vs {}", hit(&kv), hit(&d));
        for q in ["p50", "p99"] {
            assert!(
                ttft(&kv, q) < ttft(&d, q),
                "{other} {q}: {} vs {}",
                ttft(&kv, q),
                ttft(&d, q)
            );
        }
    }
    // Weight 0 routes by load alone: the cache no longer draws requests.
    assert!(hit(&run("kv", "0")) < hit(&kv));
    let bad = kvsched(&["simulate", "--route", "kv", "--kv-overlap-weight", "-1"]);
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn a_store_shared_by_the_replicas_serves_what_another_computed() {
    let root = env!("CARGO_MANIFEST_DIR");
    let trace = format!("{root}/tests/data/mooncake_conversation_head30.jsonl");
    let base = [
        trace.as_str(),
        "--check",
        "--kv-gpu-pages",
        "8192",
        "--replicas",
        "4",
    ];
    let alone = simulated("store-none", &base);
    let shared = simulated(
        "store-shared",
        &[&base[..], &["--remote-store", "20000"]].concat(),
    );
    assert_eq!(shared["invariant_violations"], 0);
    assert_eq!(shared["requests_completed"], shared["requests_total"]);
    let remote = &shared["remote"];
    let loaded = remote["blocks_loaded"].as_u64().unwrap();
    assert!(loaded > 0, "{remote}");
    assert!(remote["blocks_saved"].as_u64().unwrap() >= loaded);
    // What one replica loads from the store, it does not compute: the prefix hit rate rises.
    let hit = |d: &serde_json::Value| d["prefix_hit_rate"].as_f64().unwrap();
    assert!(
        hit(&shared) > hit(&alone),
        "{} vs {}",
        hit(&shared),
        hit(&alone)
    );
    assert!(alone.get("remote").is_none());
    // A store needs the prefix cache (it is asked by block keys), and a well-formed size.
    let bad = kvsched(&["simulate", "--remote-store", "100", "--no-prefix-reuse"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("prefix cache"));
    let bad = kvsched(&["simulate", "--remote-store", "0"]);
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn prefill_engines_hand_their_kv_to_decode_engines() {
    let root = env!("CARGO_MANIFEST_DIR");
    let trace = format!("{root}/tests/data/mooncake_conversation_head30.jsonl");
    let run = |name: &str| {
        simulated(
            name,
            &[
                trace.as_str(),
                "--check",
                "--kv-gpu-pages",
                "8192",
                "--disagg",
                "1:2",
            ],
        )
    };
    let d = run("disagg");
    assert_eq!(d["invariant_violations"], 0);
    assert_eq!(d["requests_completed"], d["requests_total"]);
    let total = d["requests_total"].as_u64().unwrap();
    let rows = d["replicas"].as_array().unwrap();
    let roles: Vec<&str> = rows.iter().map(|r| r["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["prefill", "decode", "decode"]);
    assert_eq!(
        rows[0]["requests"].as_u64(),
        Some(total),
        "every arrival prefills"
    );
    let x = &d["disagg"];
    let transfers = x["transfers"].as_u64().unwrap();
    // Every request with more than its first token to produce moves to a decode engine, once.
    let decoded: u64 = rows[1..]
        .iter()
        .map(|r| r["requests"].as_u64().unwrap())
        .sum();
    assert!(transfers > 0 && transfers <= total, "{x}");
    assert_eq!(decoded, transfers);
    assert!(x["transfer_gb"].as_f64().unwrap() > 0.0);
    // A transfer takes at least the link's latency (50 µs).
    assert!(x["handoff_ms"]["p50"].as_f64().unwrap() >= 0.05, "{x}");
    // The first token is the prefill engine's; the decode engines measure none.
    assert!(rows[0]["ttft_ms"]["p50"].as_f64().unwrap() > 0.0);
    assert_eq!(rows[1]["ttft_ms"]["p99"].as_f64(), Some(0.0));
    // Deterministic for a seed (but for the scheduler's own measured time).
    let without_timing = |mut d: serde_json::Value| {
        d.as_object_mut().unwrap().remove("sched_ns_per_iter");
        d.as_object_mut().unwrap().remove("wall_seconds");
        d
    };
    assert_eq!(without_timing(d), without_timing(run("disagg-again")));
    // Bad input: no engines on a side, a malformed link, and --replicas beside it.
    for bad in [
        &["simulate", "--disagg", "0:2"][..],
        &["simulate", "--disagg", "2:2:fast"],
        &["simulate", "--disagg", "2:2", "--replicas", "4"],
    ] {
        let out = kvsched(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
    let out = kvsched(&["simulate", "--disagg", "0:2"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("P:D"));
}

#[test]
fn check_modes_audit_as_asked_and_change_nothing() {
    let small = [
        "--no-progress",
        "--limit",
        "300",
        "--adapters",
        "8",
        "--kv-gpu-pages",
        "1024",
    ];
    let with = |extra: &[&str]| {
        let mut args = small.to_vec();
        args.extend_from_slice(extra);
        simulated(&format!("check{}", extra.join("")), &args)
    };
    let plain = with(&[]);
    let spot = with(&["--check"]);
    let every = with(&["--check", "--check-every", "7"]);
    let full = with(&["--check=full"]);
    let iterations = plain["iterations"].as_u64().expect("iterations");
    assert!(iterations > 100, "{iterations}");
    // One audit per K iterations and one at the end.
    let audits = |r: &serde_json::Value| r["exact_audits"].as_u64().expect("audits");
    assert_eq!(audits(&plain), 0);
    assert_eq!(audits(&spot), iterations / 1000 + 1);
    assert_eq!(audits(&every), iterations / 7 + 1);
    assert_eq!(audits(&full), iterations + 1);
    for r in [&spot, &every, &full] {
        assert_eq!(r["invariant_violations"], 0);
        // Checking reads the state only: the run is the same.
        for k in [
            "iterations",
            "tokens_generated",
            "preempted",
            "suspended",
            "pages_offloaded",
        ] {
            assert_eq!(r[k], plain[k], "{k}");
        }
    }
    for (bad, says) in [
        (&["--check", "--check-every", "0"][..], "--check-every"),
        (&["--check-every", "5"][..], "--check"),
        (&["--check=sometimes"][..], "full"),
    ] {
        let mut args = vec!["simulate"];
        args.extend_from_slice(&small);
        args.extend_from_slice(bad);
        let out = kvsched(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
        assert!(err.contains(says), "{bad:?}: {err}");
    }
}

#[test]
fn fault_options_need_their_store_or_link_and_a_valid_rate() {
    for (bad, says) in [
        (&["--store-faults", "0.1"][..], "--remote-store"),
        (&["--link-faults", "0.1"][..], "--disagg"),
        (
            &["--remote-store", "1000", "--store-faults", "1.5"][..],
            "LOAD_FAIL",
        ),
        (
            &["--disagg", "1:1", "--link-faults", "0.1:0.1:0"][..],
            "TIMEOUT_MS",
        ),
    ] {
        let mut args = vec!["simulate", "--no-progress", "--limit", "10"];
        args.extend_from_slice(bad);
        let out = kvsched(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
        assert!(err.contains(says), "{bad:?}: {err}");
    }
}

/// Runs `kvsched simulate ARGS…` and returns its exit status and stderr.
fn refused(args: &[&str]) -> (Option<i32>, String) {
    let mut all = vec!["simulate", "--no-progress"];
    all.extend_from_slice(args);
    let out = kvsched(&all);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_plot_the_run_cannot_draw_is_refused_before_the_run() {
    let svg = tmp("cluster.svg");
    let s = svg.to_str().unwrap();
    for cluster in [
        &["--replicas", "2"][..],
        &["--disagg", "1:1"],
        &["--remote-store", "1000"],
    ] {
        let mut args = cluster.to_vec();
        args.extend_from_slice(&["--plot", s]);
        let (code, err) = refused(&args);
        assert_eq!(code, Some(2), "{cluster:?}: {err}");
        assert!(err.contains("--plot") && err.contains("cluster"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(!err.contains("requests completed"), "not run: {err}");
    }
    assert!(!svg.exists());
    let png = tmp("out.png");
    let (code, err) = refused(&["--plot", png.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(".svg") && err.contains("out.png"), "{err}");
    assert!(!png.exists());
}

#[test]
fn output_paths_are_checked_before_the_run_and_named_once() {
    let dir = tmp("");
    let d = dir.to_str().unwrap().trim_end_matches('/').to_string();
    let missing = format!("{d}/no-such-folder/x.svg");
    for (flag, path, why) in [
        ("--plot", missing.as_str(), "folder does not exist"),
        ("--json", d.as_str(), "is a folder"),
    ] {
        let (code, err) = refused(&["--limit", "20", flag, path]);
        assert_eq!(code, Some(2), "{flag} {path}: {err}");
        assert!(err.contains(why), "{err}");
        assert_eq!(err.matches(path).count(), 1, "the path once: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(!err.contains(".tmp"), "no temporary file's name: {err}");
    }
}

/// A write that fails after the run (the folder exists but takes no files) is a run failure: status
/// 1, the path named once, no temporary file's name.
#[cfg(target_os = "linux")]
#[test]
fn a_write_that_fails_after_the_run_names_the_path_once() {
    for (flag, path) in [
        ("--json", "/proc/kvsched.json"),
        ("--plot", "/proc/kvsched.svg"),
    ] {
        let (code, err) = refused(&["--limit", "20", flag, path]);
        assert_eq!(code, Some(1), "{err}");
        assert_eq!(err.matches(path).count(), 1, "{err}");
        assert!(!err.contains(".tmp") && !err.contains("os error"), "{err}");
    }
}

#[test]
fn option_mistakes_exit_2_like_clap_and_run_failures_1() {
    for bad in [
        &["--max-batch", "0"][..],
        &["--replicas", "0"],
        &["--kv-gpu-pages", "16"],
        &["--replicas", "2", "--max-tokens", "0"],
        &["--sweep", "max-batch=0,8"],
    ] {
        let (code, err) = refused(bad);
        assert_eq!(code, Some(2), "{bad:?}: {err}");
    }
    #[cfg(target_os = "linux")]
    assert_eq!(
        refused(&["--limit", "20", "--json", "/proc/x.json"]).0,
        Some(1)
    );
}

#[test]
fn options_that_do_nothing_here_are_named_on_stderr() {
    for (args, flag) in [
        (&["--route", "kv"][..], "--route"),
        (&["--remote-store", "1000"], "--remote-store"),
        (&["--drain-after", "3"], "--drain-after"),
    ] {
        let mut all = args.to_vec();
        all.extend_from_slice(&["--limit", "20"]);
        let (code, err) = refused(&all);
        assert_eq!(code, Some(0), "{err}");
        let w: Vec<&str> = err.lines().filter(|l| l.contains("warning")).collect();
        assert_eq!(w.len(), 1, "{args:?}: {err}");
        assert!(w[0].contains(flag), "{err}");
    }
    for quiet in [
        &["--route", "kv", "--replicas", "2"][..],
        &["--drain-after", "3", "--admission", "vtc"],
        &[],
    ] {
        let mut all = quiet.to_vec();
        all.extend_from_slice(&["--limit", "20"]);
        let (code, err) = refused(&all);
        assert_eq!(code, Some(0), "{err}");
        assert!(!err.contains("warning"), "{quiet:?}: {err}");
    }
}

#[test]
fn the_report_says_what_it_measured_and_what_its_words_mean() {
    // Without --check nothing counted the invariant violations: null, not 0.
    let r = simulated("unchecked", &["--no-progress", "--limit", "20"]);
    assert!(
        r["invariant_violations"].is_null(),
        "{}",
        r["invariant_violations"]
    );
    let r = simulated("checked", &["--no-progress", "--limit", "20", "--check"]);
    assert_eq!(r["invariant_violations"], 0);
    // Every engine's text report names its cost model, legacy's too.
    for engine in ["legacy", "h200-llama3-8b"] {
        let out = kvsched(&[
            "simulate",
            "--no-progress",
            "--limit",
            "20",
            "--engine",
            engine,
        ]);
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().find(|l| l.contains("cost model (--engine)"));
        assert!(line.is_some_and(|l| l.contains(engine)), "{engine}: {text}");
    }
    // The sweep table's "overloaded" column is defined next to it.
    let out = kvsched(&[
        "simulate",
        "--no-progress",
        "--limit",
        "50",
        "--sweep",
        "rate=1,2",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let note = text.lines().find(|l| l.starts_with("overloaded:"));
    assert!(
        note.is_some_and(|l| l.contains("median request waited over 10 s")
            && l.contains("after the last arrival")),
        "{text}"
    );
}

#[test]
fn a_trace_with_a_misspelled_field_or_no_requests_says_which_file_and_why() {
    let typo = tmp("typo.jsonl");
    std::fs::write(
        &typo,
        "{\"timestamp\": 0, \"input_lenght\": 9, \"output_length\": 1, \"hash_ids\": [0]}\n",
    )
    .unwrap();
    let (code, err) = refused(&[typo.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("typo.jsonl:1")
            && err.contains("unknown field \"input_lenght\"")
            && err.contains("field input_length is missing"),
        "{err}"
    );
    let header = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
    let (head, zeros) = (tmp("header-only.csv"), tmp("zeros.csv"));
    std::fs::write(&head, header).unwrap();
    let zero_rows = "2023-11-16 18:15:46.6805900,0,44\n2023-11-16 18:15:47.6805900,9,0\n";
    std::fs::write(&zeros, format!("{header}{zero_rows}")).unwrap();
    let h = head.to_str().unwrap();
    let z = zeros.to_str().unwrap();
    for (args, file, why) in [
        (&[h][..], "header-only.csv", "no rows"),
        (&[z], "zeros.csv", "0 tokens"),
        (&["--limit", "0"], "azure_conv_head.csv", "--limit 0"),
    ] {
        let (code, err) = refused(args);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains(file) && err.contains(why), "{args:?}: {err}");
    }
}
