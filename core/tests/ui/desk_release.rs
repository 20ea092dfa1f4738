// Only the core returns leases (inside the suspend / recompute / preempt / finish transitions).
use kvsched_core::adapter::PeftBackend;
use kvsched_core::lease::{AdapterDesk, AdapterLease};
use kvsched_core::RequestId;

fn give_back<P: PeftBackend>(desk: &mut AdapterDesk<P, 4>, lease: AdapterLease) {
    let _ = desk.release(RequestId(1), lease, false);
}

fn main() {}
