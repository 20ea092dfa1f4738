// Leases are minted only by the adapter desk: outside the core one cannot be built.
use kvsched_core::adapter::TaskRef;
use kvsched_core::lease::AdapterLease;
use kvsched_core::{RequestId, TaskId};

fn forge() -> AdapterLease {
    AdapterLease { task: TaskRef { id: TaskId(1), slot: 0 }, holder: RequestId(7) }
}

fn main() {}
