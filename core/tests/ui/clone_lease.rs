// An adapter lease is proof of one request's device ownership: it cannot be cloned.
use kvsched_core::lease::AdapterLease;

fn duplicate(l: AdapterLease) -> (AdapterLease, AdapterLease) {
    (Clone::clone(&l), l)
}

fn main() {}
