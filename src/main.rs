//! The `kvsched` command line: `simulate`, `conformance`, `bench`, `groups-sweep`, `hybrid-sweep`, `cost`, `generate`, `serve`. The work is the
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
mod hybrid;
mod simulate;

/// Counts the process's heap allocations so `kvsched bench` can report those of its timed iterations.
#[global_allocator]
static ALLOC: kvsched_bench::CountingAlloc = kvsched_bench::CountingAlloc;

/// The commands, each with what it does (each parses its own options: `kvsched <command> --help`).
const COMMANDS: [(&str, &str); 9] = [
    (
        "simulate",
        "replay a request trace through the scheduler on a simulated engine",
    ),
    (
        "conformance",
        "run scenario files (files or folders of *.json); prints `N passed, M failed`",
    ),
    ("bench", "measure the scheduling pass, in-process"),
    (
        "groups-sweep",
        "full-only against grouped KV over context lengths",
    ),
    (
        "hybrid-sweep",
        "a hybrid recurrent model against full attention over prompt lengths",
    ),
    ("cost", "predict a forward step's time under a cost model"),
    (
        "generate",
        "serve chat prompts with a real model on the real scheduler",
    ),
    ("serve", "an OpenAI-compatible HTTP server on the engine"),
    (
        "help",
        "this help, or a command's (`kvsched help simulate`)",
    ),
];

/// The top-level command line: clap names the commands, prints the usage and the version; the
/// arguments after a command go to it untouched.
fn command() -> clap::Command {
    let sub = |(name, about): (&'static str, &'static str)| {
        clap::Command::new(name)
            .about(about)
            .disable_help_flag(true)
            .arg(
                clap::Arg::new("args")
                    .num_args(0..)
                    .trailing_var_arg(true)
                    .allow_hyphen_values(true),
            )
    };
    clap::Command::new("kvsched")
        .version(env!("CARGO_PKG_VERSION"))
        .about("kvsched: a scheduler core for LLM serving, its simulator, engine and server")
        .after_help("Run `kvsched <command> --help` for a command's options.")
        .disable_help_subcommand(true)
        .subcommand_required(true)
        .arg_required_else_help(true)
        .subcommands(COMMANDS.map(sub))
}

fn main() -> ExitCode {
    let matches = match command().try_get_matches_from(std::env::args()) {
        Ok(m) => m,
        Err(e) => return args::exit(&e),
    };
    let Some((name, sub)) = matches.subcommand() else {
        return ExitCode::from(2);
    };
    let rest: Vec<String> = sub
        .get_many::<String>("args")
        .map(|v| v.cloned().collect())
        .unwrap_or_default();
    run(name, &rest)
}

/// Runs command `name` with its arguments.
fn run(name: &str, args: &[String]) -> ExitCode {
    match name {
        "conformance" => conformance(args),
        "bench" => bench::cli(args),
        "simulate" => simulate::main(args),
        "cost" => cost::cli(args),
        "groups-sweep" => groups::cli(args),
        "hybrid-sweep" => hybrid::cli(args),
        "generate" => generate::cli(args),
        "serve" => kvsched_server::cli(args),
        _ => help(args),
    }
}

/// `kvsched help [COMMAND]`.
fn help(args: &[String]) -> ExitCode {
    match args.first() {
        None => {
            let _ = command().print_help();
            ExitCode::SUCCESS
        }
        Some(c) if c != "help" && COMMANDS.iter().any(|(n, _)| n == c) => {
            run(c, &["--help".to_string()])
        }
        Some(c) => {
            eprintln!("kvsched help: unknown command {c:?}");
            ExitCode::from(2)
        }
    }
}

/// `kvsched conformance`'s options.
#[derive(Debug, clap::Parser)]
#[command(
    name = "kvsched conformance",
    about = "Runs scenario files (the format: docs/conformance-format.md) and prints \
        one line per file, then `N passed, M failed`; fails when one fails or when the paths hold no \
        scenario file."
)]
struct ConformanceArgs {
    /// Run them again on KV groups (the target leading a window group as long as a request) and
    /// compare every pass with the plain run.
    #[arg(long)]
    grouped: bool,
    /// Scenario files, or folders searched for `*.json`.
    #[arg(value_name = "PATH", required = true)]
    paths: Vec<PathBuf>,
}

fn conformance(args: &[String]) -> ExitCode {
    let a: ConformanceArgs = match args::parse("kvsched conformance", args) {
        Ok(a) => a,
        Err(e) => return args::exit(&e),
    };
    if a.grouped {
        return conformance_grouped(&a.paths);
    }
    match kvsched_conformance::run_paths(&a.paths) {
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
