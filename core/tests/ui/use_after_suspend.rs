// A transition consumes the request: the active request is gone once it is suspended.
use kvsched_core::adapter::PeftBackend;
use kvsched_core::kv::KvBackend;
use kvsched_core::lease::AdapterDesk;
use kvsched_core::request::{Active, Request};

fn twice<K: KvBackend, P: PeftBackend>(r: Request<Active>, kv: &mut K, desk: &mut AdapterDesk<P, 4>) {
    let paused = r.suspend(kv, desk);
    r.finish(kv, desk);
    paused.finish(kv, desk);
}

fn main() {}
