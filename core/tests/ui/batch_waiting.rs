// A request that owns no KV (waiting, not admitted) cannot be put in a batch as a context chunk.
use kvsched_core::output::SchedulerOutput;
use kvsched_core::request::{Request, Waiting};

fn schedule(out: &mut SchedulerOutput<4>, r: &Request<Waiting>) {
    let _ = out.push_context(r, 16, true);
}

fn main() {}
