//! Fuzz target `ops`: any byte string decodes (`harness::decode`) to a configuration and a sequence of
//! scheduler operations with injected faults; `harness::run` applies them to the real scheduler and a
//! naive model and checks every invariant of DESIGN.md §7 after each one (the same harness as the
//! model-based property tests in core/tests/model.rs, `kvsched-testkit`). The input chooses the KV backend
//! too: the built-in pool, or KV groups (draft bits 3: the pool leads 1 or 2 sliding-window groups, each
//! pool and window set by one more byte), whose every group the harness audits and holds to its window
//! rule. A broken invariant, a panic or an overflow is a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;

use kvsched_testkit as harness;

fuzz_target!(|data: &[u8]| {
    let (setup, ops) = harness::decode(data);
    if let Err(e) = harness::run(setup.clone(), &ops) {
        panic!("{e}\nsetup: {setup:?}");
    }
});
