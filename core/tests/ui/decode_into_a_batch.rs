// Bytes decode into plain data for another rank, never into a batch the scheduler would accept.
use kvsched_core::output::SchedulerOutput;
use kvsched_core::wire;

fn forge(bytes: &[u8], out: &mut SchedulerOutput<4>) {
    let _ = wire::decode(bytes, out);
}

fn main() {}
