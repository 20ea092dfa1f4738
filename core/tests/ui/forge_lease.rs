// Leases are minted only by the adapter desk: outside the core one cannot be built.
use kvsched_core::lease::AdapterLease;
use kvsched_core::RequestId;

fn forge() -> AdapterLease {
    AdapterLease { holder: RequestId(7) }
}

fn main() {}
