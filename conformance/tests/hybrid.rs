//! Scenarios with a recurrent-state group (`kv.state`): a wrong state expectation fails and names
//! what differed, the format's misuses are malformed with their field, and a record carries the
//! state group's trace.

use kvsched_conformance::record::{record, Backing};
use kvsched_conformance::scenario::Scenario;
use kvsched_conformance::{run_scenario, ScenarioError};

fn scenario(json: &str) -> Scenario {
    serde_json::from_str(json).expect("a scenario")
}

fn run(json: &str) -> Result<(), String> {
    run_scenario(&scenario(json)).map_err(|e| e.to_string())
}

/// Two first chunks beside two GPU state slots and one host slot, then a pass where r0's growth
/// is refused and r1 is suspended: its state moves to the host.
fn suspension(expect: &str) -> String {
    format!(
        r#"{{"name": "h", "kv": {{"state": {{"gpu_slots": 2, "host_slots": 1}},
            "try_allocate_generation": {{"ids": {{"0": [false, true]}}, "else": "ok"}}}},
            "requests": [{{"id": 0, "state": "CONTEXT_INIT"}}, {{"id": 1, "state": "CONTEXT_INIT"}}],
            "passes": [{{"expect": {{"context": [0, 1]}}}}, {{"expect": {expect}}}]}}"#
    )
}

#[test]
fn state_expectations_pass_when_right_and_fail_naming_the_difference_when_wrong() {
    let right = r#"{"paused": [1], "state": {"moves": [{"id": 1, "op": "to_host", "src": 1, "dst": 0}],
        "placement": {"0": "gpu 0", "1": "host 0"}, "gpu_free": 1, "snapshots": 0, "ready": {},
        "captures": [], "stats": {"offloaded": 1, "reloaded": 0}}}"#;
    run(&suspension(right)).expect("the suspension as it is");
    for (wrong, says) in [
        (
            r#"{"state": {"moves": [{"id": 1, "op": "to_gpu"}]}}"#,
            "state.moves: expected [\"1 to_gpu ?→?\"], got [\"1 to_host 1→0\"]",
        ),
        (
            r#"{"state": {"moves": []}}"#,
            "state.moves: expected [], got",
        ),
        (
            r#"{"state": {"placement": {"1": "held"}}}"#,
            "state.placement.1: expected \"held\", got \"host 0\"",
        ),
        (
            r#"{"state": {"placement": {"1": "host 1"}}}"#,
            "state.placement.1",
        ),
        (
            r#"{"state": {"gpu_free": 0}}"#,
            "state.gpu_free: expected 0, got 1",
        ),
        (
            r#"{"state": {"stats": {"offloaded": 2}}}"#,
            "state.stats.offloaded: expected 2, got 1",
        ),
        (
            r#"{"state": {"captures": [{"id": 0, "position": 64}]}}"#,
            "state.captures",
        ),
        (r#"{"state": {"ready": {"7": 64}}}"#, "state.ready"),
    ] {
        let e = run(&suspension(wrong)).expect_err(wrong);
        assert!(e.contains("pass 2: ") && e.contains(says), "{wrong}: {e}");
    }
}

#[test]
fn a_wrong_state_expectation_adds_to_the_other_differences() {
    let e = run(&suspension(r#"{"paused": [], "state": {"gpu_free": 2}}"#))
        .expect_err("two differences");
    assert!(
        e.contains("paused: expected []") && e.contains("state.gpu_free"),
        "{e}"
    );
}

#[test]
fn misuses_of_the_state_group_are_malformed_with_their_field() {
    let malformed = |json: &str| match run_scenario(&scenario(json)) {
        Err(ScenarioError::Malformed { field, reason }) => format!("{field}: {reason}"),
        other => panic!("{json}: {other:?}"),
    };
    let e = malformed(
        r#"{"name": "m", "requests": [{"id": 0}], "expect": {"state": {"gpu_free": 1}}}"#,
    );
    assert_eq!(e, "expect.state: needs kv.state (a recurrent-state group)");
    let e = malformed(
        r#"{"name": "m", "kv": {"state": {"gpu_slots": 1}}, "requests": [{"id": 0}], "expect": {}}"#,
    );
    assert!(
        e.starts_with(
            "requests[0]: a recurrent-state group does not take a request that starts with a cache"
        ),
        "{e}"
    );
    let e = malformed(
        r#"{"name": "m", "kv": {"state": {"gpu_slots": 2}, "inactive": [0]},
            "requests": [{"id": 0, "state": "CONTEXT_INIT"}], "expect": {}}"#,
    );
    assert!(e.starts_with("kv.inactive: "), "{e}");
    let e = malformed(
        r#"{"name": "m", "kv": {"state": {"gpu_slots": 1}},
            "requests": [{"id": 0, "state": "CONTEXT_INIT"}, {"id": 1, "state": "CONTEXT_INIT"}],
            "expect": {}}"#,
    );
    assert!(
        e.starts_with("kv.state: ") && e.contains("ever hold"),
        "{e}"
    );
    let e = malformed(
        r#"{"name": "m", "kv": {"state": {"gpu_slots": 1}},
            "requests": [{"id": 0, "state": "CONTEXT_INIT"}],
            "expect": {"state": {"placement": {"0": "gpu zero"}}}}"#,
    );
    assert!(e.starts_with("expect.state.placement.0: expected"), "{e}");
    let e = malformed(
        r#"{"name": "m", "kv": {"state": {"gpu_slots": 1, "keys": {"x": [1]}}},
            "requests": [{"id": 0, "state": "CONTEXT_INIT"}], "expect": {}}"#,
    );
    assert!(e.starts_with("kv.state.keys: "), "{e}");
    let typo = serde_json::from_str::<Scenario>(
        r#"{"name": "m", "kv": {"state": {"gpu_slot": 1}}, "requests": [], "expect": {}}"#,
    );
    assert!(typo.is_err_and(|e| e.to_string().contains("unknown field `gpu_slot`")));
}

#[test]
fn a_record_carries_the_state_group_and_the_grouped_backings_leave_it_out() {
    let sc = scenario(&suspension("{}"));
    let passes = record(&sc, Backing::Plain, true).expect("recorded");
    assert!(
        passes[1].pools.contains("state moves [\"1 to_host 1→0\"]"),
        "{:?}",
        passes[1]
    );
    assert!(record(&sc, Backing::WholeWindow, true).is_err());
    let left = kvsched_conformance::grouped::left_out(&sc).expect("left out");
    assert!(left.contains("recurrent-state group"), "{left}");
}
