// A list entry is made only from a typed request: its fields are private.
use kvsched_core::output::Listed;

fn forge() -> Listed {
    Listed { slot: 0, task: 0, generation: 0 }
}

fn main() {}
