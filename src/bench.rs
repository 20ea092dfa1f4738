//! `kvsched bench`: the scheduling-pass scenarios of `kvsched-bench`, measured in-process.

use std::process::ExitCode;

use kvsched_bench::{counting_installed, measure, Measured, Scenario};

/// Default timed iterations per scenario of `kvsched bench`.
pub const DEFAULT_ITERS: u64 = 10_000;

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
        mean, median and p99 pass."
)]
struct BenchArgs {
    /// S1-64 S1-256 S1-1024 S2 S3 S3s S3h S4 S5 S6 S7, churn (the pass under a shipped trace's
    /// arrivals and finishes, through the simulator), or all.
    #[arg(value_name = "NAME", default_value = "all", value_parser = scenarios)]
    name: Option<Scenarios>,
    /// The same as NAME.
    #[arg(long, value_name = "NAME", value_parser = scenarios, conflicts_with = "name")]
    scenario: Option<Scenarios>,
    /// Timed iterations per scenario.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_ITERS, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

/// The scenarios a NAME selects, and whether it selects the churn scenario.
#[derive(Debug, Clone)]
struct Scenarios(Vec<Scenario>, bool);

fn scenarios(v: &str) -> Result<Scenarios, String> {
    if v.eq_ignore_ascii_case("all") {
        return Ok(Scenarios(Scenario::ALL.to_vec(), true));
    }
    if v.eq_ignore_ascii_case("churn") {
        return Ok(Scenarios(Vec::new(), true));
    }
    Scenario::parse(v)
        .map(|s| Scenarios(vec![s], false))
        .ok_or_else(|| {
            let names: Vec<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
            format!(
                "unknown scenario {v:?} (one of {}, churn, all)",
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
    let Scenarios(which, churn) = a
        .scenario
        .or(a.name)
        .unwrap_or_else(|| Scenarios(Scenario::ALL.to_vec(), true));
    let (iters, json) = (a.iters, a.json);
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
