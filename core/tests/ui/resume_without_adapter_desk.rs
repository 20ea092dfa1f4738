// Resuming a suspended request needs the KV backend AND the adapter desk: without the desk it does not
// compile, so a resumed request can never miss its adapter lease.
use kvsched_core::kv::KvBackend;
use kvsched_core::request::{KvReturn, Paused, Request, Suspended};

fn resume<K: KvBackend>(r: Request<Suspended<Paused>>, kv: &mut K) {
    let _ = r.resume(kv, KvReturn::Generation);
}

fn main() {}
