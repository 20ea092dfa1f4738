// The output's lists are private: nothing can be listed by hand, past the typed `push_*` methods.
use kvsched_core::output::{Listed, SchedulerOutput};

fn smuggle(out: &mut SchedulerOutput<4>, l: Listed) {
    let _ = out.generation.push(l);
}

fn main() {}
