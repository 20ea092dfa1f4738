// Only the core acquires leases (inside the admit / resume / replay transitions).
use kvsched_core::adapter::{PeftBackend, TaskRef};
use kvsched_core::lease::AdapterDesk;
use kvsched_core::RequestId;

fn lease<P: PeftBackend>(desk: &mut AdapterDesk<P, 4>, task: TaskRef) {
    let _ = desk.acquire(RequestId(1), task, None);
}

fn main() {}
