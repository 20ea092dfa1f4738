// A resumed request's pages must be copied up before its step: it settles into an ordinary active
// request only with the proof that the engine took the page moves.
use kvsched_core::request::{Active, Request, Resumed};

fn settle(r: Request<Resumed>) -> Request<Active> {
    r.settle()
}

fn main() {}
