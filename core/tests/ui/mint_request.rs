// Requests are minted only by the scheduler's table: there is no public constructor.
use kvsched_core::request::{Request, Waiting};

fn main() {
    let _mint = Request::<Waiting>::new;
}
