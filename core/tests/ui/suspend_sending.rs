// A sending request holds no lease and is never a victim: it cannot be suspended (only `sent` ends it).
use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::lease::AdapterDesk;
use kvsched_core::page_pool::KvPool;
use kvsched_core::request::{Request, Sending};

fn evict(r: Request<Sending>, kv: &mut KvPool<'_>, desk: &mut AdapterDesk<AdapterPool<4>, 4>) {
    let _ = r.suspend(kv, desk);
}

fn main() {}
