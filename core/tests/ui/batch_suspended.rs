// A batch accepts only Active and Resumed requests: a suspended one cannot be scheduled.
use kvsched_core::output::SchedulerOutput;
use kvsched_core::request::{Paused, Request, Suspended};

fn schedule(out: &mut SchedulerOutput<4>, r: &Request<Suspended<Paused>>) {
    let _ = out.push_generation(r);
}

fn main() {}
