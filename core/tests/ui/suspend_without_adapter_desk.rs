// Suspending a lease holder returns its lease: without the adapter desk it does not compile (the
// upstream bug kept the adapter pinned on the device).
use kvsched_core::kv::KvBackend;
use kvsched_core::request::{Active, Request};

fn suspend<K: KvBackend>(r: Request<Active>, kv: &mut K) {
    let _ = r.suspend(kv);
}

fn main() {}
