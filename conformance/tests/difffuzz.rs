//! A differential fuzz of the scheduling pass over generated scenarios (RELIABILITY.md, "Differential
//! fuzz").
//!
//! Scenario files are generated at random as JSON values — configuration (request and token budgets,
//! chunking, capacity policy, recompute pause, prefix-aware budget, window, deadlock threshold,
//! admission), the scripted pools (host tier, eviction, every method's script in each of its forms,
//! initial caches, block reuse and probes, draft and cross pools, a connector and sends in flight), an
//! adapter cache, requests in every starting phase the format takes, and passes that remove, update,
//! add, mark in flight and end transfers — written out as text and read back by the format's own
//! parser, so the file format is exercised too. A generated scenario has no expectations: each is
//! recorded ([`kvsched_conformance::record::record`]) several ways and compared pass by pass, field by
//! field:
//!
//! - (a) with the incremental pass and with full passes only, on the plain pools: everything, the
//!   draft and cross pools' calls included;
//! - (b) where KV groups can hold the scenario ([`grouped::left_out`]): the plain pools against KV
//!   groups of one group (the target alone as the leader), incremental and full, and against the
//!   target leading one window group as long as a request (which never releases or refuses):
//!   everything but the other pools' calls, which differ by construction.
//!
//! On a difference the scenario is printed as a file for tests/conformance/. `cargo test` runs 256
//! cases; `KVSCHED_PROPTEST_CASES` sets more.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use kvsched_conformance::grouped;
use kvsched_conformance::record::{record, Backing, PassRecord};
use kvsched_conformance::scenario::Scenario;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{json, Value};

#[path = "difffuzz/generate.rs"]
mod generate;

use generate::{scenario, Gen};

fn cases() -> u32 {
    std::env::var("KVSCHED_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// A record, or why there is none (a malformed scenario, a panic).
type Recorded = Result<Vec<PassRecord>, String>;

fn run(sc: &Scenario, backing: Backing, incremental: bool) -> Recorded {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        record(sc, backing, incremental).map_err(|e| e.to_string())
    }))
    .unwrap_or_else(|p| {
        let why = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        Err(format!("panicked: {why}"))
    })
}

/// The first difference of two records, field by field (`pools`: the other pools' calls too).
fn differ(a: &Recorded, b: &Recorded, pools: bool) -> Option<String> {
    // A panic is a failure of its own, whatever the other run did.
    for r in [a, b] {
        if let Err(why) = r
            .as_ref()
            .map(|_| ())
            .map_err(|e| e.starts_with("panicked"))
        {
            if why {
                return Some(format!("a run: {}", r.as_ref().err().map_or("", |e| e)));
            }
        }
    }
    let (a, b) = match (a, b) {
        (Ok(a), Ok(b)) => (a, b),
        (a, b) if a == b => return None,
        (a, b) => {
            return Some(format!(
                "outcomes: {:?}\n vs {:?}",
                a.as_ref().err(),
                b.as_ref().err()
            ))
        }
    };
    let k = (0..a.len().max(b.len())).find(|&k| {
        let (x, y) = (a.get(k), b.get(k));
        x.map(|r| &r.trace) != y.map(|r| &r.trace)
            || (pools && x.map(|r| &r.pools) != y.map(|r| &r.pools))
    })?;
    let field = |r: Option<&PassRecord>| -> Vec<String> {
        r.map_or_else(
            || "(no pass)".into(),
            |r| format!("{}; pools {}", r.trace, r.pools),
        )
        .split("; ")
        .map(str::to_owned)
        .collect()
    };
    let (x, y) = (field(a.get(k)), field(b.get(k)));
    let fields: Vec<String> = (0..x.len().max(y.len()))
        .filter(|&i| x.get(i) != y.get(i))
        .filter(|&i| {
            pools
                || !x
                    .get(i)
                    .is_some_and(|f| f.starts_with("pools") || f.is_empty())
        })
        .map(|i| {
            format!(
                "  {}\n  vs {}",
                x.get(i).map_or("-", |s| s),
                y.get(i).map_or("-", |s| s)
            )
        })
        .collect();
    Some(format!("pass {}:\n{}", k + 1, fields.join("\n")))
}

/// What the runs covered, summed over the cases.
#[derive(Default)]
struct Tally {
    cases: AtomicUsize,
    malformed: AtomicUsize,
    grouped: AtomicUsize,
    passes: AtomicUsize,
    stopped: AtomicUsize,
    errors: AtomicUsize,
}

/// One generated scenario, every way: `Err` with the differences and the scenario as a file.
fn check(g: &Gen, tally: &Tally) -> Result<(), TestCaseError> {
    let json = g.to_json();
    let text = serde_json::to_string_pretty(&json).expect("a JSON value prints");
    let sc: Scenario = serde_json::from_str(&text).map_err(|e| {
        TestCaseError::fail(format!("the generated file does not parse: {e}\n{text}"))
    })?;
    let fail = |what: &str, diff: String| failure(what, &diff, &text);
    tally.cases.fetch_add(1, Relaxed);
    let inc = run(&sc, Backing::Plain, true);
    let full = run(&sc, Backing::Plain, false);
    if let Some(d) = differ(&inc, &full, true) {
        return Err(fail("(a) the incremental and the full pass", d));
    }
    let Ok(passes) = &full else {
        tally.malformed.fetch_add(1, Relaxed);
        if std::env::var_os("KVSCHED_DIFFFUZZ_STOPS").is_some() {
            eprintln!("malformed: {:?}", full.as_ref().err());
        }
        return Ok(());
    };
    tally.passes.fetch_add(passes.len(), Relaxed);
    let last = passes.last().map_or("", |p| p.trace.as_str());
    if last.starts_with("stopped") {
        tally.stopped.fetch_add(1, Relaxed);
        if std::env::var_os("KVSCHED_DIFFFUZZ_STOPS").is_some() {
            eprintln!("{last}");
        }
    }
    if passes.iter().any(|p| p.trace.starts_with("error Some")) {
        tally.errors.fetch_add(1, Relaxed);
    }
    if grouped::left_out(&sc).is_some() {
        return Ok(());
    }
    tally.grouped.fetch_add(1, Relaxed);
    grouped_alike(&json, full)
}

/// A difference, with the scenario that shows it as a file.
fn failure(what: &str, diff: &str, text: &str) -> TestCaseError {
    TestCaseError::fail(format!(
        "{what} differ at {diff}\n\nthe scenario (save it under tests/conformance/ as a regression):\n{text}"
    ))
}

/// (b): the plain pools (`full`: their record with full passes) against KV groups of one group and a
/// window group as long as a request. Without the target's scripted probes (`kv.probe`): groups cap a
/// first chunk's claim at the hit they agree, which a scripted pool answers from its probe and a plain
/// set never asks for, so the claim's recorded limit differs by construction (with real pools the cap
/// is what the claim finds).
fn grouped_alike(json: &Value, mut full: Recorded) -> Result<(), TestCaseError> {
    let mut json = json.clone();
    let probed = json["kv"]["probe"]
        .as_object()
        .is_some_and(|p| !p.is_empty());
    json["kv"]["probe"] = json!({});
    let text = serde_json::to_string_pretty(&json).expect("a JSON value prints");
    let sc: Scenario = serde_json::from_str(&text).expect("the scenario parsed with its probes");
    let fail = |what: &str, diff: String| failure(what, &diff, &text);
    if probed {
        full = run(&sc, Backing::Plain, false);
    }
    let one_inc = run(&sc, Backing::OneGroup, true);
    let one_full = run(&sc, Backing::OneGroup, false);
    if let Some(d) = differ(&one_inc, &one_full, true) {
        return Err(fail(
            "(a) on one group, the incremental and the full pass",
            d,
        ));
    }
    if let Some(d) = differ(&full, &one_inc, false) {
        return Err(fail("(b) the plain pools and KV groups of one group", d));
    }
    let window = run(&sc, Backing::WholeWindow, true);
    if let Some(d) = differ(&full, &window, false) {
        return Err(fail(
            "(b) the plain pools and a window group as long as a request",
            d,
        ));
    }
    Ok(())
}

#[test]
fn generated_scenarios_run_alike_every_way() {
    let config = Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    };
    let tally = Tally::default();
    let result = TestRunner::new(config).run(&scenario(), |g| check(&g, &tally));
    let n = |a: &AtomicUsize| a.load(Relaxed);
    println!(
        "difffuzz: {} scenarios ({} refused as malformed, {} also on KV groups), {} passes, {} stopped \
         by a refused step, {} with a pass error",
        n(&tally.cases),
        n(&tally.malformed),
        n(&tally.grouped),
        n(&tally.passes),
        n(&tally.stopped),
        n(&tally.errors),
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}
