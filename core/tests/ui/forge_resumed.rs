// `Resumed` carries the fresh lease and has no public constructor: the only way to one is
// `Request<Suspended<Paused>>::resume`, which re-acquires the lease.
use kvsched_core::request::Resumed;

fn skip_the_lease() -> Resumed {
    Resumed { lease: None }
}

fn main() {}
