//! Fuzz target `ops`: any byte string decodes (`harness::decode`) to a configuration and a sequence of
//! scheduler operations with injected faults; `harness::run` applies them to the real scheduler and a
//! naive model and checks every invariant of DESIGN.md §7 after each one (the same harness as the
//! model-based property tests in core/tests/model.rs, `kvsched-testkit`). A broken invariant, a panic or
//! an overflow is a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;

use kvsched_testkit as harness;

fuzz_target!(|data: &[u8]| {
    let (setup, ops) = harness::decode(data);
    if let Err(e) = harness::run(setup.clone(), &ops) {
        panic!("{e}\nsetup: {setup:?}");
    }
});
