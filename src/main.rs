//! The `kvsched` command line: `simulate`, `conformance`, `bench`, `groups-sweep`, `cost`, `generate`, `serve`. The work is the
//! library crates' (`kvsched-sim`, `kvsched-conformance`, `kvsched-bench`, `kvsched-engine`, `kvsched-server`); this binary parses the arguments, words their
//! errors in terms of its flags, and prints.

use std::path::PathBuf;
use std::process::ExitCode;

mod args;
mod bench;
mod churn;
mod cost;
mod generate;
mod groups;
mod simulate;

/// Counts the process's heap allocations so `kvsched bench` can report those of its timed iterations.
#[global_allocator]
static ALLOC: kvsched_bench::CountingAlloc = kvsched_bench::CountingAlloc;

const USAGE: &str = "usage: kvsched <command> [options]
commands:
  simulate [options]       replay a request trace through the scheduler (see `kvsched simulate --help`)
  conformance PATH...      run scenario files (files or folders of *.json); prints `N passed, M failed`
  conformance --grouped PATH...
                           run them again on KV groups (the target leading a window group as long as a
                           request) and compare every pass with the plain run
  bench [options]          measure the scheduling pass (see `kvsched bench --help`)
  groups-sweep [options]   full-only against grouped KV over context lengths (see `kvsched groups-sweep --help`)
  cost [options]           predict a forward step's time under a cost model (see `kvsched cost --help`)
  generate --model FILE PROMPT...
                           serve chat prompts with a real model on the real scheduler (see `kvsched generate --help`)
  serve --model FILE       an OpenAI-compatible HTTP server on the engine (see `kvsched serve --help`)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("conformance") => conformance(&args[1..]),
        Some("bench") => bench::cli(&args[1..]),
        Some("simulate") => simulate::main(&args[1..]),
        Some("cost") => cost::cli(&args[1..]),
        Some("groups-sweep") => groups::cli(&args[1..]),
        Some("generate") => generate::cli(&args[1..]),
        Some("serve") => kvsched_server::cli(&args[1..]),
        Some("-h" | "--help") | None => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("kvsched: unknown command {other:?}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn conformance(args: &[String]) -> ExitCode {
    let (grouped, args) = match args.split_first() {
        Some((flag, rest)) if flag == "--grouped" => (true, rest),
        _ => (false, args),
    };
    if args.is_empty() {
        eprintln!("usage: kvsched conformance [--grouped] PATH...");
        return ExitCode::from(2);
    }
    let paths: Vec<PathBuf> = args.iter().map(PathBuf::from).collect();
    if grouped {
        return conformance_grouped(&paths);
    }
    match kvsched_conformance::run_paths(&paths) {
        Ok(r) => print_report(&r.lines, &[], &r.summary(), r.failed),
        Err(e) => {
            eprintln!("kvsched conformance: {e}");
            ExitCode::from(2)
        }
    }
}

/// A conformance run's lines, the files left out with why, its summary; failure when any failed.
fn print_report(
    lines: &[String],
    left_out: &[(String, &str)],
    summary: &str,
    failed: usize,
) -> ExitCode {
    for l in lines {
        println!("{l}");
    }
    for (name, why) in left_out {
        println!("left out {name}: {why}");
    }
    println!("{summary}");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `kvsched conformance --grouped`: the grouped suite (`kvsched_conformance::grouped`).
fn conformance_grouped(paths: &[PathBuf]) -> ExitCode {
    match kvsched_conformance::grouped::run_paths_grouped(paths) {
        Ok(r) => print_report(&r.lines, &r.left_out, &r.summary(), r.failed),
        Err(e) => {
            eprintln!("kvsched conformance: {e}");
            ExitCode::from(2)
        }
    }
}
