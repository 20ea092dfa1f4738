//! `kvsched-dynamo`: kvsched's engine as an NVIDIA Dynamo worker (docs/DYNAMO.md).

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use kvsched_dynamo::args::Args;
use kvsched_dynamo::{model_dir, KvschedEngine};

/// Dynamo's bound on a worker's shutdown after its grace period, seconds.
const SHUTDOWN_TIMEOUT: &str = "DYN_WORKER_GRACEFUL_SHUTDOWN_TIMEOUT";

/// Seconds beyond the drain for the engine thread to stop and Dynamo to tear its runtime down.
const STOP_RESERVE_S: u64 = 5;

fn main() -> ExitCode {
    let args = Args::parse();
    if args.common.disaggregation_mode != dynamo_backend_common::DisaggregationMode::Aggregated {
        eprintln!(
            "kvsched-dynamo: only an aggregated worker is served (--disaggregation-mode agg)"
        );
        return ExitCode::from(2);
    }
    kvsched_engine::init_threads(usize::from(args.threads));
    let folder = args.folder();
    if let Err(e) = model_dir::write(&folder, &args.model, args.max_model_len as usize) {
        eprintln!("kvsched-dynamo: {e}");
        return ExitCode::FAILURE;
    }
    eprintln!("kvsched-dynamo: the model folder is {}", folder.display());
    // Dynamo force-exits a worker whose shutdown outlasts DYN_WORKER_GRACEFUL_SHUTDOWN_TIMEOUT (5 s in
    // a debug build, 30 s in release): unless the operator set it, it covers --drain-timeout and the
    // engine thread's stop after it. Set before any thread starts.
    if std::env::var_os(SHUTDOWN_TIMEOUT).is_none() {
        let secs = args.drain_timeout.max(0.0).ceil() as u64 + STOP_RESERVE_S;
        std::env::set_var(SHUTDOWN_TIMEOUT, secs.to_string());
    }
    let config = args.worker_config();
    let engine = Arc::new(KvschedEngine::new(args.setup()));
    match dynamo_backend_common::run(engine, config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvsched-dynamo: {e:#}");
            ExitCode::FAILURE
        }
    }
}
