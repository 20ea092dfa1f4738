// The scheduler lends its adapter backend out read-only: registrations cannot be changed behind its back.
use kvsched_core::adapter::{AdapterHold, PeftBackend};
use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::{KvPool, Scheduler};

fn drop_behind_the_back(s: &mut Scheduler<KvPool<'_>, AdapterPool<4>, 4, 4>) {
    let t = s.adapters().backend().lookup(kvsched_core::TaskId(1)).unwrap();
    s.adapters().backend().mark_request_done(kvsched_core::RequestId(0), t, false, AdapterHold::Lease);
}

fn main() {}
