//! Walks every type-state transition (request.rs's numbered diagram) on the real fixed-capacity backends and
//! checks what each one does to the KV pool and the adapter cache; the drop bomb; and the seeds' bug
//! reproduction (upstream issue #18407) through the whole pass with recording fakes.

use kvsched::conformance::scenario::Outcomes;
use kvsched::conformance::scripted::{PeftCall, ScriptedKv, ScriptedPeft, Scripts};
use kvsched::memory::KvMemory;
use kvsched_core::adapter::{AdapterPool, PeftBackend, TaskRef};
use kvsched_core::kv::{ContextPrep, KvBackend, KvRef};
use kvsched_core::lease::AdapterDesk;
use kvsched_core::output::SchedulerOutput;
use kvsched_core::page_pool::KvPoolConfig;
use kvsched_core::request::{KvReturn, Request, RequestId, RequestSpec, TaskId};
use kvsched_core::scheduler::{Adopt, Scheduler};
use kvsched_core::{Config, Phase};

fn cfg(host: u32) -> KvPoolConfig {
    KvPoolConfig {
        tokens_per_block: 4,
        gpu_pages: 16,
        host_pages: host,
        slots: 4,
        max_blocks: 8,
    }
}

/// Gives a first chunk of `tokens` tokens its KV pages, as the pass does before admission.
fn place(kv: &mut kvsched_core::page_pool::KvPool<'_>, r: KvRef, tokens: u32) {
    let prep = ContextPrep {
        first_chunk: true,
        prompt: tokens,
        position: 0,
    };
    assert!(kv.prepare_context(r, prep).is_some());
    assert!(kv.resize_context(r, tokens, true));
}

fn task_state(desk: &AdapterDesk<AdapterPool<4>, 4>, t: TaskRef) -> (u32, u32, u32) {
    let e = desk.backend().tasks()[t.slot as usize];
    (desk.leases(t.slot), e.active, e.paused)
}

#[test]
fn every_transition_moves_exactly_what_it_owns() {
    let mut mem = KvMemory::new(cfg(16));
    let mut kv = mem.pool().unwrap();
    let mut pool: AdapterPool<4> = AdapterPool::new(8, 8).unwrap();
    let t = pool.register(TaskId(7), 2).unwrap();
    let mut desk: AdapterDesk<AdapterPool<4>, 4> = AdapterDesk::new(pool);
    let r = KvRef {
        slot: 0,
        id: RequestId(1),
    };

    // (1) admit: the pass gave the first chunk its pages; the desk mints the lease.
    let w = Request::new(r, Some(t));
    place(&mut kv, r, 8);
    let active = w.admit(&kv, &mut desk).unwrap();
    assert_eq!(task_state(&desk, t), (1, 1, 0));
    assert_eq!(active.lease().unwrap().task(), t);

    // (2) suspend: pages move to the host tier, lease returned with pause.
    let paused = active.suspend(&mut kv, &mut desk);
    assert_eq!(task_state(&desk, t), (0, 0, 1));
    assert!(!kv.is_active(r) && kv.has_cache(r));
    assert_eq!(kv.gpu_free(), 16, "two pages moved down");
    assert_eq!(kv.take_moves().len(), 2);
    assert!(paused.paused_on().is_some());

    // (3) resume: KV back AND a fresh lease, consuming the paused registration.
    assert!(kv.try_allocate_generation(r, 1));
    let resumed = paused
        .resume(&mut kv, &mut desk, KvReturn::Generation)
        .unwrap();
    assert_eq!(task_state(&desk, t), (1, 1, 0));
    assert!(resumed.lease().is_some());
    // (5) settle.
    let active = resumed.settle();

    // (4) recompute pause from Active: KV freed, lease returned with pause.
    let rc = active.recompute(&mut kv, &mut desk);
    assert_eq!(task_state(&desk, t), (0, 0, 1));
    assert!(!kv.has_cache(r));
    assert_eq!(kv.gpu_free(), 16);

    // (6) replay: the replay's first chunk gets pages, then a new lease.
    place(&mut kv, r, 4);
    let active = rc.replay(&kv, &mut desk).unwrap();
    assert_eq!(task_state(&desk, t), (1, 1, 0));

    // (7) preempt: pages given up, lease returned with pause; (8) finish drops the paused registration.
    let rc = active.preempt(&mut kv, &mut desk);
    assert_eq!(task_state(&desk, t), (0, 0, 1));
    rc.finish(&mut kv, &mut desk);
    assert_eq!(task_state(&desk, t), (0, 0, 0));
    assert!(kv.check() && desk.backend().check());

    // (4) from Suspended<Paused>, and (8) finish of Active / Suspended.
    place(&mut kv, r, 8);
    let a = Request::new(r, Some(t)).admit(&kv, &mut desk).unwrap();
    let p = a.suspend(&mut kv, &mut desk);
    let rc = p.recompute(&mut kv);
    assert_eq!(
        task_state(&desk, t),
        (0, 0, 1),
        "still paused on its adapter for the replay"
    );
    assert_eq!(kv.host_free(), 16, "host pages freed");
    rc.finish(&mut kv, &mut desk);
    place(&mut kv, r, 8);
    let a = Request::new(r, Some(t)).admit(&kv, &mut desk).unwrap();
    a.finish(&mut kv, &mut desk);
    assert_eq!(task_state(&desk, t), (0, 0, 0));
    assert_eq!(kv.gpu_free(), 16);
    assert!(kv.check() && desk.backend().check());
}

#[test]
fn a_refused_lease_changes_nothing_and_a_paused_host_copy_survives_pressure() {
    // Host adapter cache of 4 pages: tasks a and b (2 pages each) are pinned by paused requests, so c
    // cannot be stored on the host and its admission is refused, changing nothing.
    let mut mem = KvMemory::new(cfg(16));
    let mut kv = mem.pool().unwrap();
    let mut pool: AdapterPool<4> = AdapterPool::new(4, 4).unwrap();
    let a = pool.register(TaskId(1), 2).unwrap();
    let b = pool.register(TaskId(2), 2).unwrap();
    let c = pool.register(TaskId(3), 2).unwrap();
    let mut desk: AdapterDesk<AdapterPool<4>, 4> = AdapterDesk::new(pool);
    let mut paused = Vec::new();
    for (slot, t) in [(0u16, a), (1, b)] {
        let r = KvRef {
            slot,
            id: RequestId(slot as u64),
        };
        place(&mut kv, r, 4);
        let act = Request::new(r, Some(t)).admit(&kv, &mut desk).unwrap();
        paused.push(act.suspend(&mut kv, &mut desk));
    }
    let r2 = KvRef {
        slot: 2,
        id: RequestId(2),
    };
    place(&mut kv, r2, 4);
    let before: Vec<_> = desk.backend().tasks().to_vec();
    let refused = Request::new(r2, Some(c)).admit(&kv, &mut desk).unwrap_err();
    assert_eq!(
        refused.error,
        kvsched_core::PeftError::HostCacheFull(TaskId(3))
    );
    assert_eq!(
        desk.backend().tasks(),
        &before[..],
        "a refused admission changes nothing"
    );
    assert_eq!(desk.leases(c.slot), 0);
    refused.request.finish(&mut kv);
    // The paused requests' host copies were pinned, so both resumes succeed.
    for p in paused {
        let r = p.kv_ref();
        assert!(kv.try_allocate_generation(r, 1));
        let back = p.resume(&mut kv, &mut desk, KvReturn::Generation).unwrap();
        back.settle().finish(&mut kv, &mut desk);
    }
    assert_eq!(kv.gpu_free(), 16);
    assert!(kv.check() && desk.backend().check());
    let _ = desk.backend().max_device_pages();
}

#[test]
#[should_panic(expected = "dropped while it still owns resources")]
fn dropping_an_active_request_is_caught() {
    let mut mem = KvMemory::new(cfg(0));
    let mut kv = mem.pool().unwrap();
    let mut desk: AdapterDesk<AdapterPool<4>, 4> =
        AdapterDesk::new(AdapterPool::new(4, 4).unwrap());
    let r = KvRef {
        slot: 0,
        id: RequestId(3),
    };
    place(&mut kv, r, 4);
    let active = Request::new(r, None).admit(&kv, &mut desk).unwrap();
    drop(active);
}

#[test]
fn the_drop_bomb_stays_quiet_while_unwinding() {
    // A panic while a request is held must unwind normally (a second panic would abort the process).
    let caught = std::panic::catch_unwind(|| {
        let mut mem = KvMemory::new(cfg(0));
        let mut kv = mem.pool().unwrap();
        let mut desk: AdapterDesk<AdapterPool<4>, 4> =
            AdapterDesk::new(AdapterPool::new(4, 4).unwrap());
        let r = KvRef {
            slot: 0,
            id: RequestId(3),
        };
        place(&mut kv, r, 4);
        let _active = Request::new(r, None).admit(&kv, &mut desk).unwrap();
        panic!("engine failure");
    });
    assert!(caught.is_err());
}

fn scripted(can_evict: bool, allocate: Outcomes) -> ScriptedKv {
    ScriptedKv::new(
        true,
        can_evict,
        Scripts {
            prepare: Outcomes::Always(true),
            resize: Outcomes::Always(true),
            allocate,
            disagg: Outcomes::Always(true),
        },
    )
}

type Fake = Scheduler<ScriptedKv, ScriptedPeft, 16, 8>;

fn peft_calls(s: &Fake) -> Vec<PeftCall> {
    s.adapters()
        .backend()
        .calls
        .iter()
        .copied()
        .filter(|c| !matches!(c, PeftCall::DetermineNumPages(_)))
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
            kvsched::conformance::scenario::PerId::Seq(vec![false, true, true]),
        );
        ids.insert(0, kvsched::conformance::scenario::PerId::Seq(vec![true]));
        Outcomes::ById {
            ids,
            after_released: Default::default(),
            otherwise: true,
        }
    } else {
        let mut ids = std::collections::BTreeMap::new();
        ids.insert(
            0,
            kvsched::conformance::scenario::PerId::Seq(vec![false, true]),
        );
        Outcomes::ById {
            ids,
            after_released: Default::default(),
            otherwise: true,
        }
    };
    let mut kv = scripted(true, allocate);
    let a = TaskId(1);
    let b = TaskId(2);
    let peft = ScriptedPeft::new(1, &[(1, 1), (2, 1)]);
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
    s.peft_mut().load_leased();
    s.peft_mut().calls.clear();
    let mut out: Box<SchedulerOutput<16>> = Box::default();
    s.schedule(&mut out).unwrap();
    let ids = |l: &kvsched_core::output::List<16>| l.iter().map(|x| x.id.0).collect::<Vec<_>>();
    assert_eq!(ids(&out.paused), vec![0], "A is suspended");
    assert_eq!(ids(&out.context), vec![1], "B is admitted in the same pass");
    let calls = peft_calls(&s);
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
        out.adapter_loads.iter().any(|t| t.id == b),
        "B's adapter was loaded"
    );
    assert_eq!(
        s.adapters().backend().active(a.0),
        0,
        "A holds no lease while suspended"
    );
    if victim {
        assert_eq!(ids(&out.generation), vec![5]);
    }

    // Pass 2: B finished; A's KV comes back and it re-acquires its lease before it is scheduled.
    s.complete_step(&out);
    s.remove(c1).unwrap();
    s.peft_mut().calls.clear();
    s.schedule(&mut out).unwrap();
    assert!(ids(&out.generation).contains(&0));
    assert_eq!(ids(&out.resumed), vec![0]);
    let calls = peft_calls(&s);
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
    assert_eq!(s.adapters().backend().active(a.0), 1);
}

#[test]
fn seeds_bug_self_eviction_returns_and_restores_the_lease() {
    seeds_reproduction(false);
}

#[test]
fn seeds_bug_victim_eviction_returns_and_restores_the_lease() {
    seeds_reproduction(true);
}

/// Two partially prefilled contexts that each need the other's pages (a host tier exists, so the
/// reference has no context-side preemption and no generation step evicts): the stalled-pass wedge breaker
/// suspends the younger to the host tier and both finish; the stall never reaches the deadlock threshold.
#[test]
fn wedged_partial_contexts_finish_with_a_host_tier() {
    use kvsched_core::config::{ChunkPolicy, Chunking};
    let mut mem = KvMemory::new(KvPoolConfig {
        tokens_per_block: 4,
        gpu_pages: 8,
        host_pages: 16,
        slots: 4,
        max_blocks: 8,
    });
    let cfg = Config {
        chunking: Some(Chunking {
            policy: ChunkPolicy::FirstComeFirstServed,
            unit: 4,
        }),
        max_num_tokens: Some(8),
        max_context_length: Some(4),
        deadlock_threshold: 3,
        ..Config::default()
    };
    let mut s: Box<Scheduler<_, _, 4, 1>> =
        Box::new(Scheduler::new(cfg, mem.pool().unwrap(), kvsched_core::NoPeft).unwrap());
    let mut handles = Vec::new();
    for id in 0..2 {
        let mut spec = RequestSpec::new(id, Phase::ContextInit, 20);
        spec.max_new_tokens = 2;
        handles.push(s.submit(spec).unwrap());
    }
    let mut out: Box<SchedulerOutput<4>> = Box::default();
    let mut decoded = [0u32; 2];
    let mut suspensions = 0;
    for pass in 0..60 {
        s.schedule(&mut out)
            .unwrap_or_else(|e| panic!("pass {pass}: {e}"));
        suspensions += out.paused.len();
        s.complete_step(&out);
        for l in out.generation.iter() {
            decoded[l.id.0 as usize] += 1;
        }
        for (i, h) in handles.clone().into_iter().enumerate() {
            if decoded[i] >= 2 && s.get(h).is_ok() {
                s.remove(h).unwrap();
            }
        }
        if s.is_empty() {
            assert!(suspensions >= 1, "the wedge was broken by a suspension");
            assert!(s.kv().check());
            assert_eq!(s.kv().gpu_free(), 8);
            return;
        }
    }
    panic!("wedged: requests left {}", s.len());
}
