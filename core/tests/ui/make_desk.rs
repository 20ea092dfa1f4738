// The adapter desk, the capability every lease transition needs, is made only by the scheduler.
use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::lease::AdapterDesk;

fn desk() -> AdapterDesk<AdapterPool<4>, 4> {
    AdapterDesk::new(AdapterPool::new(4, 4).unwrap())
}

fn main() {}
