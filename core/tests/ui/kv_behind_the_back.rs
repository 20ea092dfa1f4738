// The scheduler lends its KV backend out read-only: caches cannot be changed behind its back.
use kvsched_core::{KvPool, NoPeft, Scheduler};

fn free_behind_the_back(s: &mut Scheduler<KvPool<'_>, NoPeft, 4, 1>) {
    use kvsched_core::kv::{KvBackend, KvRef};
    s.kv_mut().free(KvRef { slot: 0, id: kvsched_core::RequestId(0) });
}

fn main() {}
