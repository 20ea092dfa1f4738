//! The seeds' bug reproduction (upstream issue #18407) through the whole pass with recording fakes: the
//! exact adapter calls a suspension and a resume make. The type-state transitions one by one, the drop
//! bomb and the real-pool versions of these runs are the core crate's own tests
//! (`cargo test -p kvsched-core`: `request/tests.rs`, `scheduler/tests.rs`).

use kvsched_conformance::scenario::Outcomes;
use kvsched_conformance::scripted::{PeftCall, ScriptedKv, ScriptedPeft, Scripts};
use kvsched_core::ids::TaskId;
use kvsched_core::output::{Listed, SchedulerOutput};
use kvsched_core::request::{Ownership, RequestSpec};
use kvsched_core::scheduler::{Adopt, Scheduler};
use kvsched_core::{Config, Phase};

fn scripted(can_evict: bool, allocate: Outcomes) -> ScriptedKv {
    ScriptedKv::new(
        true,
        can_evict,
        Scripts {
            prepare: Outcomes::Always(true),
            resize: Outcomes::Always(true),
            allocate,
            disagg: Outcomes::Always(true),
            admit: Outcomes::Always(true),
        },
    )
}

type Fake = Scheduler<ScriptedKv, ScriptedPeft, 16, 8>;

fn peft_calls(peft: &ScriptedPeft) -> Vec<PeftCall> {
    peft.calls()
        .iter()
        .copied()
        .filter(|c| !matches!(c, PeftCall::DetermineNumPages(_)))
        .collect()
}

fn ids(s: &Fake, list: &[Listed]) -> Vec<u64> {
    list.iter()
        .map(|l| s.get(l.handle()).unwrap().spec().id.0)
        .collect()
}

/// The seeds' bug (upstream issue #18407): a PEFT device cache that holds one adapter; a generation request on
/// adapter A and a queued context request on adapter B; A's allocation fails and A is suspended (`victim`:
/// evicted by a head request on A; else self-evicted). Suspension must return A's lease (pause = true) exactly
/// once so B is admitted and its adapter loads; when A's KV comes back it re-acquires its lease
/// (add_request(A, load = true)) exactly once before it is scheduled.
fn seeds_reproduction(victim: bool) {
    let allocate = if victim {
        // Head g5 (no adapter) fails once and succeeds after A's request 0 is evicted; 0 then resumes.
        let mut ids = std::collections::BTreeMap::new();
        ids.insert(
            5,
            kvsched_conformance::scenario::PerId::Seq(vec![false, true, true]),
        );
        ids.insert(0, kvsched_conformance::scenario::PerId::Seq(vec![true]));
        Outcomes::ById {
            ids,
            after_released: std::collections::BTreeMap::default(),
            otherwise: true,
        }
    } else {
        let mut ids = std::collections::BTreeMap::new();
        ids.insert(
            0,
            kvsched_conformance::scenario::PerId::Seq(vec![false, true]),
        );
        Outcomes::ById {
            ids,
            after_released: std::collections::BTreeMap::default(),
            otherwise: true,
        }
    };
    let kv = scripted(true, allocate);
    let a = TaskId(1);
    let b = TaskId(2);
    let peft = ScriptedPeft::new(1, &[(1, 1), (2, 1)]);
    let peft_ctl = peft.clone();
    let mut s: Box<Fake> = Box::new(
        Scheduler::new(
            Config::default(),
            {
                kv.set_cache(0, Some(true), 0);
                if victim {
                    kv.set_cache(5, Some(true), 0);
                }
                kv
            },
            peft,
        )
        .unwrap(),
    );
    if victim {
        // A head request without an adapter whose allocation evicts A from the tail.
        s.adopt(RequestSpec::generation(5, 16), Adopt::Active)
            .unwrap();
    }
    let c1 = s
        .submit(RequestSpec::new(1, Phase::ContextInit, 16).with_lora(2))
        .unwrap();
    let g0 = s
        .adopt(RequestSpec::generation(0, 16).with_lora(1), Adopt::Active)
        .unwrap();
    peft_ctl.load_leased();
    peft_ctl.clear_calls();
    let mut out: Box<SchedulerOutput<16>> = Box::default();
    s.schedule(&mut out).unwrap();
    let context: Vec<Listed> = out.context().iter().map(|c| c.listed).collect();
    assert_eq!(ids(&s, out.paused()), vec![0], "A is suspended");
    assert_eq!(ids(&s, &context), vec![1], "B is admitted in the same pass");
    let calls = peft_calls(&peft_ctl);
    assert_eq!(
        calls
            .iter()
            .filter(|c| **c == PeftCall::MarkRequestDone(0, true))
            .count(),
        1,
        "{calls:?}"
    );
    assert!(calls.contains(&PeftCall::AddRequest(1, true)), "{calls:?}");
    s.ensure_batch(&mut out)
        .expect("B's adapter loads: A's device copy is evictable");
    assert!(
        out.adapter_loads().iter().any(|t| t.id == b),
        "B's adapter was loaded"
    );
    assert_eq!(peft_ctl.active(a.0), 0, "A holds no lease while suspended");
    if victim {
        assert_eq!(ids(&s, out.generation()), vec![5]);
    }

    // Pass 2: B finished; A's KV comes back and it re-acquires its lease before it is scheduled.
    let _ = s.take_moves();
    s.complete_step(&out).unwrap();
    s.remove(c1).unwrap();
    peft_ctl.clear_calls();
    s.schedule(&mut out).unwrap();
    assert!(ids(&s, out.generation()).contains(&0));
    assert_eq!(ids(&s, out.resumed()), vec![0]);
    assert_eq!(s.get(g0).unwrap().ownership(), Ownership::Resumed);
    let calls = peft_calls(&peft_ctl);
    assert_eq!(
        calls,
        vec![PeftCall::AddRequest(0, true)],
        "exactly one re-acquisition, no release"
    );
    s.ensure_batch(&mut out).unwrap();
    assert_eq!(
        s.adapters().leases(s.get(g0).unwrap().task().unwrap().slot),
        1
    );
    assert_eq!(peft_ctl.active(a.0), 1);
    let _ = s.take_moves();
    assert_eq!(s.get(g0).unwrap().ownership(), Ownership::Active);
    assert!(s.check());
}

#[test]
fn seeds_bug_self_eviction_returns_and_restores_the_lease() {
    seeds_reproduction(false);
}

#[test]
fn seeds_bug_victim_eviction_returns_and_restores_the_lease() {
    seeds_reproduction(true);
}
