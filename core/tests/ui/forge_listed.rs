// A list entry is made only from a typed request: its fields are private.
use kvsched_core::ids::TaskSlot;
use kvsched_core::output::Listed;

fn forge() -> Listed {
    Listed { slot: 0, task: TaskSlot::NONE, version: 0 }
}

fn main() {}
