// A request whose KV is being sent (disaggregated serving) is never scheduled: the batch refuses it.
use kvsched_core::output::SchedulerOutput;
use kvsched_core::request::{Request, Sending};

fn schedule(out: &mut SchedulerOutput<4>, r: &Request<Sending>) {
    let _ = out.push_generation(r);
}

fn main() {}
