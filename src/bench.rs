//! `kvsched bench`: the scheduling-pass scenarios of `kvsched-bench`, measured in-process.

use std::process::ExitCode;

use kvsched_bench::depth::{measure_depth, Depth, DepthMeasured, DEPTH_PASSES};
use kvsched_bench::{counting_installed, measure, Measured, Scenario};

/// Default timed iterations per scenario of `kvsched bench`.
pub const DEFAULT_ITERS: u64 = 10_000;
/// Default timed iterations per depth scenario: five built states' steady passes (a state serves
/// `DEPTH_PASSES - 1` of them, the first untimed; building one at 64k takes seconds).
pub const DEFAULT_DEPTH_ITERS: u64 = 5 * (DEPTH_PASSES as u64 - 2);

/// `kvsched bench`'s options.
#[derive(Debug, clap::Parser)]
#[command(
    name = "kvsched bench",
    about = "Runs the scheduling-pass scenarios of docs/SCENARIOS.md in-process (build with --release).",
    long_about = "Runs the scheduling-pass scenarios of docs/SCENARIOS.md in-process (build with \
        --release). Prints per scenario the median and p99 µs per iteration, the floor pass's median, the \
        ratio, the median with every pass a full one (measured interleaved, the peer the incremental pass \
        is compared with) and how many times that is, the share of iterations whose pass was incremental, \
        the asserted outcome (gen/ctx/paused/recompute) and the heap allocations counted during the timed \
        iterations. `churn` (last in `all`) replays the shipped Azure conversation slice through the \
        simulator with the incremental pass and with full passes, alternating, and prints each side's \
        mean, median and p99 pass. `depth` (not in `all`) runs the pass-at-depth family \
        (kvsched_bench::depth: waiting queues of 1k-64k long prompts refused for pages behind a \
        running batch, over prefix caches of 100k and 10M blocks, and its pathological shapes): the \
        steady pass's median and p99, the floor, the waiting requests the refused run skipped, the \
        allocations; each name of the family also runs alone."
)]
struct BenchArgs {
    /// S1-64 S1-256 S1-1024 S2 S3 S3s S3h S4 S5 S6 S7, churn (the pass under a shipped trace's
    /// arrivals and finishes, through the simulator), all, depth (the pass-at-depth family) or one
    /// of its scenarios (depth-1k, depth-64k-10M, evicting-64k, ...).
    #[arg(value_name = "NAME", default_value = "all", value_parser = scenarios)]
    name: Option<Scenarios>,
    /// The same as NAME.
    #[arg(long, value_name = "NAME", value_parser = scenarios, conflicts_with = "name")]
    scenario: Option<Scenarios>,
    /// Timed iterations per scenario (default 10,000; a depth scenario's 490).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    iters: Option<u64>,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

/// The scenarios a NAME selects, whether it selects the churn scenario, and its depth scenarios.
#[derive(Debug, Clone)]
struct Scenarios(Vec<Scenario>, bool, Vec<Depth>);

fn scenarios(v: &str) -> Result<Scenarios, String> {
    if v.eq_ignore_ascii_case("all") {
        return Ok(Scenarios(Scenario::ALL.to_vec(), true, Vec::new()));
    }
    if v.eq_ignore_ascii_case("churn") {
        return Ok(Scenarios(Vec::new(), true, Vec::new()));
    }
    if v.eq_ignore_ascii_case("depth") {
        return Ok(Scenarios(Vec::new(), false, Depth::ALL.to_vec()));
    }
    if let Some(d) = Depth::parse(v) {
        return Ok(Scenarios(Vec::new(), false, vec![d]));
    }
    Scenario::parse(v)
        .map(|s| Scenarios(vec![s], false, Vec::new()))
        .ok_or_else(|| {
            let names: Vec<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
            format!(
                "unknown scenario {v:?} (one of {}, churn, all, depth, a depth scenario)",
                names.join(", ")
            )
        })
}

/// `kvsched bench`: see `kvsched bench --help`.
pub fn cli(args: &[String]) -> ExitCode {
    let a: BenchArgs = match crate::args::parse("kvsched bench", args) {
        Ok(a) => a,
        Err(e) => return crate::args::exit(&e),
    };
    let Scenarios(which, churn, depths) = a
        .scenario
        .or(a.name)
        .unwrap_or_else(|| Scenarios(Scenario::ALL.to_vec(), true, Vec::new()));
    let json = a.json;
    let iters = a.iters.unwrap_or(DEFAULT_ITERS);
    let counting = counting_installed();
    if !counting {
        eprintln!(
            "kvsched bench: the counting allocator is not installed; allocations are not counted"
        );
    }
    if cfg!(debug_assertions) && !json {
        eprintln!("kvsched bench: debug build; figures are only meaningful with --release");
    }
    if !json && !which.is_empty() {
        println!(
            "{:<8} {:>11} {:>11} {:>10} {:>7} {:>9} {:>6} {:>6} {:>6} {:>7}  outcome g/c/p/r",
            "scenario",
            "median µs",
            "p99 µs",
            "floor µs",
            "ratio",
            "full µs",
            "full÷",
            "incr",
            "allocs",
            "iters"
        );
    }
    let mut failed = false;
    for s in which {
        let m = measure(s, iters);
        failed |= counting && m.allocations > 0;
        if json {
            println!("{}", json_line(&m, counting));
        } else {
            println!("{}", table_row(&m, counting));
        }
    }
    let depth_iters = a.iters.unwrap_or(DEFAULT_DEPTH_ITERS);
    failed |= run_depths(&depths, depth_iters, json, counting);
    if churn {
        match crate::churn::measure() {
            Ok(c) if json => println!("{}", crate::churn::json(&c)),
            Ok(c) => println!("{}", crate::churn::line(&c)),
            Err(e) => {
                eprintln!("kvsched bench: churn: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if failed {
        eprintln!("kvsched bench: the timed iterations allocated");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// One scenario's figures as a JSON object (allocations `null` when they were not counted).
fn json_line(m: &Measured, counting: bool) -> serde_json::Value {
    serde_json::json!({
        "scenario": m.scenario.name(),
        "median_ns": m.median_ns,
        "p99_ns": m.p99_ns,
        "floor_ns": m.floor_ns,
        "ratio_to_floor": m.ratio_to_floor(),
        "full_median_ns": m.full_median_ns,
        "full_p99_ns": m.full_p99_ns,
        "full_over_incremental": m.speedup(),
        "incremental_iters": m.incremental,
        "iters": m.iters,
        "allocations": if counting { serde_json::json!(m.allocations) } else { serde_json::Value::Null },
        "outcome": m.outcome.to_string(),
    })
}

/// One scenario's figures as a row of the table.
fn table_row(m: &Measured, counting: bool) -> String {
    // The outcome last: its length varies (S4's names resumes and loads).
    format!(
        "{:<8} {:>11.3} {:>11.3} {:>10.4} {:>7.1} {:>9.3} {:>6.1} {:>5.0}% {:>6} {:>7}  {}",
        m.scenario.name(),
        m.median_ns / 1e3,
        m.p99_ns / 1e3,
        m.floor_ns / 1e3,
        m.ratio_to_floor(),
        m.full_median_ns / 1e3,
        m.speedup(),
        100.0 * m.incremental as f64 / m.iters as f64,
        if counting {
            m.allocations.to_string()
        } else {
            "n/a".into()
        },
        m.iters,
        m.outcome,
    )
}

/// Measures the depth scenarios `depths` (a table or JSON lines); true when one allocated.
fn run_depths(depths: &[Depth], iters: u64, json: bool, counting: bool) -> bool {
    if !json && !depths.is_empty() {
        println!(
            "{:<14} {:>11} {:>11} {:>10} {:>7} {:>8} {:>6} {:>6} {:>6}  outcome g/c/p/r",
            "scenario",
            "median µs",
            "p99 µs",
            "floor µs",
            "ratio",
            "skipped",
            "allocs",
            "iters",
            "builds"
        );
    }
    let mut failed = false;
    for &d in depths {
        let m = measure_depth(d, iters);
        failed |= counting && m.allocations > 0;
        if json {
            println!("{}", depth_json(&m, counting));
        } else {
            println!("{}", depth_row(&m, counting));
        }
    }
    failed
}

/// One depth scenario's figures as a JSON object.
fn depth_json(m: &DepthMeasured, counting: bool) -> serde_json::Value {
    serde_json::json!({
        "scenario": m.depth.name,
        "waiting": m.depth.waiting,
        "median_ns": m.median_ns,
        "p99_ns": m.p99_ns,
        "floor_ns": m.floor_ns,
        "ratio_to_floor": m.ratio_to_floor(),
        "skipped": m.depth.skipped(),
        "iters": m.iters,
        "builds": m.builds,
        "allocations": if counting { serde_json::json!(m.allocations) } else { serde_json::Value::Null },
        "outcome": m.depth.expected().to_string(),
    })
}

/// One depth scenario's figures as a row of its table.
fn depth_row(m: &DepthMeasured, counting: bool) -> String {
    format!(
        "{:<14} {:>11.3} {:>11.3} {:>10.3} {:>7.2} {:>8} {:>6} {:>6} {:>6}  {}",
        m.depth.name,
        m.median_ns / 1e3,
        m.p99_ns / 1e3,
        m.floor_ns / 1e3,
        m.ratio_to_floor(),
        m.depth.skipped(),
        if counting {
            m.allocations.to_string()
        } else {
            "n/a".into()
        },
        m.iters,
        m.builds,
        m.depth.expected(),
    )
}
