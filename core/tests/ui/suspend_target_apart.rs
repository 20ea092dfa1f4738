// A request's caches are one backend (KvSet): the scheduler lends it out read-only, so the target cache
// cannot be suspended without the draft.
use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::kv::{KvBackend, KvRef};
use kvsched_core::kv_set::KvSet;
use kvsched_core::{KvPool, Scheduler};

fn suspend_target_only(s: &mut Scheduler<KvSet<KvPool<'_>>, AdapterPool<4>, 4, 4>, r: KvRef) {
    s.kv().target().suspend(r);
}

fn main() {}
