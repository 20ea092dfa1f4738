//! The scheduler's own tests, on the real fixed-capacity backends over owned buffers (no heap): the
//! seeds' bug both ways, the resumed lifecycle until the moves are taken, the deadlock remedies, the
//! stale-output refusals, and the table's invariants through a serving loop. The rule-by-rule behaviour
//! is the conformance suite's (`kvsched conformance`); these tests need no CLI.

use super::*;
use crate::adapter_pool::AdapterPool;
use crate::config::{ChunkPolicy, Chunking};
use crate::ids::TaskId;
use crate::ids::{RequestId, TaskSlot};
use crate::page_pool::KvPool;
use crate::request::RequestSpec;
use crate::testing::Mem;

/// 32 GPU pages, up to 32 host pages, 8 slots of 8 pages.
type Pool = Mem<32, 32, 8, 64, 64>;
type Sched<'a> = Scheduler<KvPool<'a>, AdapterPool<4>, 8, 4>;
type Out = SchedulerOutput<8>;

fn adapters(device_pages: u32) -> AdapterPool<4> {
    let mut p = AdapterPool::new(device_pages, 8).unwrap();
    p.register(TaskId(1), 1).unwrap();
    p.register(TaskId(2), 1).unwrap();
    p
}

fn ids<K: KvBackend, P: PeftBackend, const N: usize, const T: usize>(
    s: &Scheduler<K, P, N, T>,
    list: &[crate::output::Listed],
) -> heapless::Vec<u64, 8> {
    list.iter()
        .map(|l| s.get(l.handle()).unwrap().spec().id.0)
        .collect()
}

/// One engine step: the pass, the adapters, the moves handed over, the step completed.
fn step<K: KvBackend, P: PeftBackend, const N: usize, const T: usize>(
    s: &mut Scheduler<K, P, N, T>,
    out: &mut SchedulerOutput<N>,
) {
    s.schedule(out).unwrap();
    s.ensure_batch(out).unwrap();
    let _ = s.take_moves();
    s.complete_step(out).unwrap();
    assert!(s.check());
}

/// The seeds' bug (upstream issue #18407), on the real adapter cache: a device cache with room for one
/// adapter; A decodes on adapter 1 holding four of the five GPU pages, and B arrives on adapter 2. A's
/// step needs a page: A is suspended to the host tier (self-evicted, or evicted by the head request F
/// whose own step needs a page). Suspension returns A's lease, so B is admitted in the same pass and its
/// adapter loads; when A's KV comes back it holds a lease again before it is batched.
fn seeds(victim: bool) {
    let mut mem = Mem::<5, 8, 4, 32, 13>::new();
    let mut s: Scheduler<KvPool<'_>, AdapterPool<4>, 4, 4> =
        Scheduler::new(Config::default(), mem.pool(8, 4), adapters(1)).unwrap();
    let mut out = SchedulerOutput::<4>::new();
    // F (no adapter) holds the fifth page: full (its next step needs a page) when it evicts A.
    let f = s
        .submit(RequestSpec::new(
            5,
            Phase::ContextInit,
            if victim { 4 } else { 3 },
        ))
        .unwrap();
    // B arrived before A (so A's self-eviction, which ends phase 1, does not hide it), but is held back
    // (in flight) until A holds its pages.
    let b = s
        .submit(RequestSpec::new(1, Phase::ContextInit, 4).with_lora(2))
        .unwrap();
    s.set_inflight(b, true).unwrap();
    let a = s
        .submit(RequestSpec::new(0, Phase::ContextInit, 16).with_lora(1))
        .unwrap();
    step(&mut s, &mut out);
    assert_eq!(s.kv().gpu_free(), 0);
    s.set_inflight(b, false).unwrap();
    s.schedule(&mut out).unwrap();
    assert_eq!(ids(&s, out.paused()), [0], "A is suspended");
    let stats = s.last_pass();
    assert_eq!(
        (stats.victims, stats.self_evictions),
        if victim { (1, 0) } else { (0, 1) }
    );
    let context: heapless::Vec<_, 4> = out.context().iter().map(|c| c.listed).collect();
    assert_eq!(ids(&s, &context), [1], "B is admitted in the same pass");
    assert_eq!(
        s.adapters().leases(TaskSlot(0)),
        0,
        "A holds no lease while suspended"
    );
    s.ensure_batch(&mut out)
        .expect("B's adapter loads: A's device copy is evictable");
    assert_eq!(out.adapter_loads().len(), 1);
    let _ = s.take_moves();
    s.complete_step(&out).unwrap();
    // B and F finish; A's KV comes back and it re-acquires its lease before it is batched.
    s.remove(b).unwrap();
    s.remove(f).unwrap();
    s.schedule(&mut out).unwrap();
    assert_eq!(ids(&s, out.resumed()), [0]);
    assert_eq!(ids(&s, out.generation()), [0]);
    assert_eq!(s.get(a).unwrap().ownership(), Ownership::Resumed);
    assert_eq!(s.adapters().leases(TaskSlot(0)), 1);
    s.ensure_batch(&mut out).unwrap();
    assert_eq!(s.take_moves().len(), 4, "A's pages come up with the moves");
    assert_eq!(s.get(a).unwrap().ownership(), Ownership::Active, "settled");
    s.complete_step(&out).unwrap();
    assert!(s.check());
    s.remove(a).unwrap();
    assert_eq!(s.adapters().backend().tasks()[0].active, 0);
    assert_eq!(s.kv().gpu_free(), 5);
}

#[test]
fn seeds_bug_self_eviction_returns_and_restores_the_lease() {
    seeds(false);
}

#[test]
fn seeds_bug_victim_eviction_returns_and_restores_the_lease() {
    seeds(true);
}

#[test]
fn a_resumed_request_stays_resumed_until_the_moves_are_taken() {
    let mut mem = Mem::<4, 8, 4, 16, 12>::new();
    let mut s: Scheduler<KvPool<'_>, AdapterPool<4>, 4, 4> =
        Scheduler::new(Config::default(), mem.pool(8, 4), adapters(4)).unwrap();
    let mut out = SchedulerOutput::<4>::new();
    let a = s
        .submit(RequestSpec::new(0, Phase::ContextInit, 8).with_lora(1))
        .unwrap();
    s.schedule(&mut out).unwrap();
    s.complete_step(&out).unwrap();
    let b = s
        .submit(RequestSpec::new(1, Phase::ContextInit, 8))
        .unwrap();
    // A grows by a page, B needs both free pages: B is skipped (no preemption with a host tier), and
    // the next pass A is alone.
    for _ in 0..3 {
        s.schedule(&mut out).unwrap();
        s.ensure_batch(&mut out).unwrap();
        s.complete_step(&out).unwrap();
    }
    // Without taking the moves, a resumed request stays Resumed pass after pass.
    let resumed: heapless::Vec<_, 4> = s
        .requests()
        .filter(|(_, e)| e.ownership() == Ownership::Resumed)
        .map(|(h, _)| h)
        .collect();
    let _ = s.take_moves();
    for (_, e) in s.requests() {
        assert_ne!(e.ownership(), Ownership::Resumed, "take_moves settles");
    }
    assert!(s.check());
    for h in resumed {
        assert_eq!(s.get(h).unwrap().ownership(), Ownership::Active);
    }
    s.remove(a).unwrap();
    s.remove(b).unwrap();
    assert_eq!((s.kv().gpu_free(), s.kv().host_free()), (4, 8));
}

#[test]
fn complete_step_takes_only_the_last_pass_once() {
    let mut mem = Pool::new();
    let mut s: Sched<'_> = Scheduler::new(Config::default(), mem.pool(0, 4), adapters(4)).unwrap();
    let h = s
        .submit(RequestSpec::new(9, Phase::ContextInit, 8))
        .unwrap();
    let mut out = Out::new();
    assert_eq!(s.complete_step(&out), Err(Error::StaleOutput));
    s.schedule(&mut out).unwrap();
    let before = s.fingerprint();
    s.complete_step(&out).unwrap();
    assert_ne!(s.fingerprint(), before);
    assert_eq!(s.get(h).unwrap().spec().phase, Phase::GenerationInProgress);
    let after = s.fingerprint();
    assert_eq!(s.complete_step(&out), Err(Error::StaleOutput));
    assert_eq!(
        s.fingerprint(),
        after,
        "a refused completion changes nothing"
    );
}

/// Two partially prefilled contexts that each need the other's pages (a host tier exists, so the
/// reference has no context-side preemption): the wedge breaker suspends the younger and both finish.
#[test]
fn wedged_partial_contexts_finish_with_a_host_tier() {
    let mut mem = Mem::<8, 16, 4, 32, 24>::new();
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
    let mut s: Scheduler<KvPool<'_>, crate::NoPeft, 4, 1> =
        Scheduler::new(cfg, mem.pool(16, 4), crate::NoPeft).unwrap();
    let mut hs = heapless::Vec::<Handle, 2>::new();
    for id in 0..2 {
        let mut spec = RequestSpec::new(id, Phase::ContextInit, 20);
        spec.max_new_tokens = 2;
        assert!(hs.push(s.submit(spec).unwrap()).is_ok());
    }
    let mut out = SchedulerOutput::<4>::new();
    let (mut decoded, mut suspensions) = ([0u32; 2], 0);
    for pass in 0..60 {
        s.schedule(&mut out)
            .unwrap_or_else(|e| panic!("pass {pass}: {e}"));
        suspensions += out.paused().len();
        for l in out.generation() {
            decoded[usize::from(l.slot())] += 1;
        }
        let _ = s.take_moves();
        s.complete_step(&out).unwrap();
        for (i, &h) in hs.iter().enumerate() {
            if decoded[i] >= 2 && s.get(h).is_ok() {
                s.remove(h).unwrap();
            }
        }
        if s.is_empty() {
            assert!(suspensions >= 1, "the wedge was broken by a suspension");
            assert_eq!(s.kv().gpu_free(), 8);
            return;
        }
    }
    panic!("wedged: requests left {}", s.len());
}

/// Without a lower tier, a suspended request's pages stay HELD on the GPU. Context-side preemption takes a
/// held request only where it would take an active one (deliberate difference 7); with no context asking,
/// the held pages are given up only when the pass would otherwise stall (the deadlock remedy).
#[test]
fn held_pages_are_given_up_only_as_a_deadlock_remedy() {
    let mut mem = Mem::<5, 1, 4, 32, 5>::new();
    let cfg = Config {
        deadlock_threshold: 5,
        ..Config::default()
    };
    let mut s: Scheduler<KvPool<'_>, crate::NoPeft, 4, 1> =
        Scheduler::new(cfg, mem.pool(0, 4), crate::NoPeft).unwrap();
    let mut out = SchedulerOutput::<4>::new();
    // C has room to decode for two more steps; A and B fill the rest of the pool.
    let c = s
        .submit(RequestSpec::new(2, Phase::ContextInit, 1))
        .unwrap();
    let a = s
        .submit(RequestSpec::new(0, Phase::ContextInit, 8))
        .unwrap();
    let b = s
        .submit(RequestSpec::new(1, Phase::ContextInit, 8))
        .unwrap();
    step(&mut s, &mut out);
    assert_eq!(s.kv().gpu_free(), 0);
    // B issues its last step (completing: no candidate for a recompute pause).
    s.update(b, |r| r.phase = Phase::GenerationToComplete)
        .unwrap();
    // A's step needs a page: B is suspended (held), then A self-evicts (held); C decodes.
    step(&mut s, &mut out);
    assert_eq!(s.get(a).unwrap().ownership(), Ownership::Paused);
    assert_eq!(s.get(b).unwrap().ownership(), Ownership::Paused);
    assert_eq!(s.kv().gpu_free(), 0, "held pages");
    // C still decodes: the pass progresses, and A's held pages are left alone.
    s.schedule(&mut out).unwrap();
    assert_eq!(ids(&s, out.generation()), [2]);
    assert!(out.recompute_paused().is_empty());
    assert_eq!((s.last_pass().preemptions, s.stall_count()), (0, 0));
    s.complete_step(&out).unwrap();
    // C in flight: nothing can run, A's step cannot get a page, B is completing. The remedy gives the
    // newest candidate's held pages up instead of counting a stall.
    s.set_inflight(c, true).unwrap();
    s.schedule(&mut out).unwrap();
    assert!(out.generation().is_empty() && out.context().is_empty());
    assert_eq!(ids(&s, out.recompute_paused()), [0]);
    assert_eq!((s.last_pass().preemptions, s.stall_count()), (1, 0));
    assert_eq!(s.get(a).unwrap().ownership(), Ownership::Recompute);
    assert_eq!(s.kv().gpu_free(), 2);
    s.complete_step(&out).unwrap();
    assert!(s.check());
    // A replays its prefill into the freed pages.
    s.schedule(&mut out).unwrap();
    let context: heapless::Vec<_, 4> = out.context().iter().map(|c| c.listed).collect();
    assert_eq!(ids(&s, &context), [0]);
    // C's step completed: its mark cleared, it can be removed (in flight it is refused).
    s.set_inflight(c, false).unwrap();
    for h in [a, b, c] {
        s.remove(h).unwrap();
    }
    assert_eq!(s.kv().gpu_free(), 5);
}

/// A serving loop with LoRA requests, chunked prefill and a host tier: after every step the table's
/// invariants, the lease counts and both pools' conservation hold, and every request finishes.
#[test]
fn a_serving_loop_keeps_every_invariant() {
    let mut mem = Pool::new();
    let cfg = Config {
        chunking: Some(Chunking {
            policy: ChunkPolicy::FirstComeFirstServed,
            unit: 4,
        }),
        max_num_tokens: Some(24),
        ..Config::default()
    };
    let mut s: Sched<'_> = Scheduler::new(cfg, mem.pool(32, 4), adapters(2)).unwrap();
    let mut out = Out::new();
    let mut left = [0u32; 8];
    let mut next = 0u64;
    for _ in 0..400 {
        while next < 40 && s.len() < 8 {
            let mut spec = RequestSpec::new(next, Phase::ContextInit, 4 + (next as u32 * 7) % 20);
            spec.max_new_tokens = 3 + (next as u32 % 5);
            let spec = if next % 3 == 0 {
                spec
            } else {
                spec.with_lora(1 + next % 2)
            };
            let h = s.submit(spec).unwrap();
            left[usize::from(h.index())] = 3 + (next as u32 % 5);
            next += 1;
        }
        step(&mut s, &mut out);
        assert!(s.kv().check() && s.adapters().backend().check());
        for l in out.generation() {
            let i = usize::from(l.slot());
            left[i] -= 1;
            if left[i] == 0 {
                s.remove(l.handle()).unwrap();
            }
        }
        if next == 40 && s.is_empty() {
            assert_eq!((s.kv().gpu_free(), s.kv().host_free()), (32, 32));
            assert_eq!(s.adapters().pinned_pages(), 0);
            return;
        }
    }
    panic!("the loop did not finish: {} left", s.len());
}

/// Disaggregated serving, context side: a context-only request's last chunk starts its send (arrow 9:
/// the lease goes back, the pages stay); nothing evicts or schedules it; a blocked context beside it is
/// not a stall; `update` cannot touch it; `end_send` frees its pages (arrow 10).
#[test]
fn a_context_only_request_sends_its_kv_and_frees_it_when_the_send_ends() {
    let mut mem = Pool::new();
    let cfg = Config {
        deadlock_threshold: 2,
        ..Config::default()
    };
    let mut s: Sched<'_> = Scheduler::new(cfg, mem.pool(0, 4), adapters(4)).unwrap();
    let mut out = Out::new();
    let c = s
        .submit(RequestSpec::context_only(0, 16).with_lora(1))
        .unwrap();
    step(&mut s, &mut out);
    let e = s.get(c).unwrap();
    assert_eq!(e.ownership(), Ownership::Sending);
    assert_eq!(e.spec().phase, Phase::DisaggContextTransInProgress);
    assert_eq!(s.adapters().leases(TaskSlot(0)), 0, "a send holds no lease");
    assert_eq!(s.kv().gpu_free(), 28, "its four pages stay pinned");
    let stats = s.transfer_stats();
    assert_eq!((stats.sending, stats.receiving), (1, 0));
    assert!(matches!(
        s.update(c, |sp| sp.phase = Phase::ContextInit),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        s.end_receive(c, TransferEnd::Delivered),
        Err(Error::Invalid(_))
    ));
    // Three requests take 24 of the 28 free pages and sit in flight; a fourth needs 8: nothing can
    // progress, but the send will free pages, so no pass is a stall (threshold 2 would raise).
    let mut busy = heapless::Vec::<Handle, 3>::new();
    for id in 1..=3 {
        let h = s
            .submit(RequestSpec::new(id, Phase::ContextInit, 32))
            .unwrap();
        busy.push(h).unwrap();
    }
    step(&mut s, &mut out);
    for &h in &busy {
        s.set_inflight(h, true).unwrap();
    }
    let g = s
        .submit(RequestSpec::new(4, Phase::ContextInit, 32))
        .unwrap();
    for _ in 0..4 {
        step(&mut s, &mut out);
        assert!(out.context().is_empty());
        assert_eq!(s.stall_count(), 0);
    }
    let spec = s.end_send(c, TransferEnd::Delivered).unwrap();
    assert_eq!(spec.id, RequestId(0));
    assert_eq!(s.kv().gpu_free(), 8);
    assert_eq!(s.transfer_stats().sent, 1);
    assert!(matches!(
        s.end_send(c, TransferEnd::Delivered),
        Err(Error::StaleHandle)
    ));
    assert!(matches!(
        s.end_send(g, TransferEnd::Delivered),
        Err(Error::Invalid(_))
    ));
    step(&mut s, &mut out);
    assert_eq!(
        out.context().len(),
        1,
        "the freed pages admit the waiting one"
    );
}

/// Disaggregated serving, generation side: a pass prepares the whole prompt (listed in `disagg`), the
/// step starts the receive; while it writes, the request is never scheduled; a delivered receive
/// commits the prompt and the request decodes; a failed one frees the KV and replays the prefill here.
#[test]
fn a_generation_request_receives_its_kv_or_replays_its_prefill() {
    for how in [TransferEnd::Delivered, TransferEnd::Failed] {
        let mut mem = Pool::new();
        let mut s: Sched<'_> =
            Scheduler::new(Config::default(), mem.pool(0, 4), adapters(4)).unwrap();
        let mut out = Out::new();
        let g = s
            .submit(RequestSpec::new(7, Phase::DisaggGenerationInit, 16).with_lora(2))
            .unwrap();
        s.schedule(&mut out).unwrap();
        assert_eq!(ids(&s, out.disagg()), [7]);
        assert!(out.generation().is_empty() && out.context().is_empty());
        s.ensure_batch(&mut out).unwrap();
        s.complete_step(&out).unwrap();
        assert_eq!(s.get(g).unwrap().spec().phase, Phase::DisaggGenerationInit);
        assert!(matches!(s.end_receive(g, how), Err(Error::Invalid(_))));
        s.start_receive(g).unwrap();
        assert!(matches!(s.start_receive(g), Err(Error::Invalid(_))));
        let e = s.get(g).unwrap();
        assert_eq!(e.spec().phase, Phase::DisaggGenerationTransInProgress);
        assert_eq!(e.ownership(), Ownership::Active);
        assert_eq!(s.transfer_stats().receiving, 1);
        assert!(s.kv().gpu_free() <= 28, "the prompt's pages are in place");
        step(&mut s, &mut out);
        assert_eq!(out.num_fitting(), 0, "a receiving request is not scheduled");
        s.end_receive(g, how).unwrap();
        assert!(matches!(s.end_receive(g, how), Err(Error::Invalid(_))));
        assert!(s.check());
        step(&mut s, &mut out);
        match how {
            TransferEnd::Delivered => {
                assert_eq!(ids(&s, out.generation()), [7]);
                assert_eq!(s.get(g).unwrap().spec().phase, Phase::GenerationInProgress);
                assert_eq!(s.transfer_stats().received, 1);
            }
            TransferEnd::Failed => {
                let context: heapless::Vec<_, 8> = out.context().iter().map(|c| c.listed).collect();
                assert_eq!(ids(&s, &context), [7], "it replays its prefill here");
                assert_eq!(out.context()[0].tokens, 16);
                assert_eq!(s.transfer_stats().receives_failed, 1);
            }
        }
        assert_eq!(s.adapters().leases(TaskSlot(1)), 1);
    }
}

/// EQUAL_PROGRESS gives the units of a context phase 2 skips to the contexts after it: W (adapter 1, 3
/// pages) arrived before H, the lease holder of adapter 2 (5 pages) mid-prefill, and the two adapters do
/// not fit the 6-page device cache together. W is planned the first 8-token unit of the 12-token budget
/// and skipped for its adapter; H's last 5 tokens fit in none of the 4 left, and nothing ran, pass after
/// pass, until W's units went to H. Once H is gone, W runs.
#[test]
fn equal_progress_gives_a_skipped_contexts_units_to_the_contexts_after_it() {
    let mut mem = Pool::new();
    let cfg = Config {
        chunking: Some(Chunking {
            policy: ChunkPolicy::EqualProgress,
            unit: 8,
        }),
        max_num_tokens: Some(12),
        ..Config::default()
    };
    let mut peft = AdapterPool::new(6, 8).unwrap();
    peft.register(TaskId(1), 3).unwrap();
    peft.register(TaskId(2), 5).unwrap();
    let mut s: Sched<'_> = Scheduler::new(cfg, mem.pool(32, 4), peft).unwrap();
    let mut out = Out::new();
    let w = s
        .submit(RequestSpec::new(1, Phase::ContextInit, 13).with_lora(1))
        .unwrap();
    // W sits out while H takes its lease and its first chunk.
    s.set_inflight(w, true).unwrap();
    let h = s
        .submit(RequestSpec::new(2, Phase::ContextInit, 13).with_lora(2))
        .unwrap();
    step(&mut s, &mut out);
    assert_eq!(s.get(h).unwrap().spec().position, 8);
    s.set_inflight(w, false).unwrap();
    let chunks = |s: &Sched<'_>, out: &Out| -> heapless::Vec<(u64, u32), 8> {
        let id = |c: &crate::output::Chunk| s.get(c.listed.handle()).unwrap().spec().id.0;
        out.context().iter().map(|c| (id(c), c.tokens)).collect()
    };
    step(&mut s, &mut out);
    assert_eq!(
        chunks(&s, &out),
        [(2, 5)],
        "the lease holder finishes its prompt"
    );
    s.remove(h).unwrap();
    step(&mut s, &mut out);
    assert_eq!(
        chunks(&s, &out),
        [(1, 8)],
        "W's adapter fits once H's is free"
    );
}
