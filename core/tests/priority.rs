//! Priority that preempts (issue 45; `Admission::Priority`, `scheduler/priority.rs`): one scenario for
//! each trap the reviews of vLLM's attempts named — no preemption among equal priorities, a victim
//! keeps its place, preemption only after the other checks pass, a LoRA victim's lease released and
//! restored, a mid-prefill victim.

use kvsched_core::config::{Admission, ChunkPolicy, Chunking};
use kvsched_core::request::Ownership;
use kvsched_core::Config;

mod support;

use support::run::Run;

/// A scheduler under priority: `gpu_pages` GPU and `host_pages` host pages, `max_requests` a batch,
/// an adapter cache of `adapter_pages` device pages (tasks 1 and 2 take one page each).
fn priority(gpu_pages: u32, host_pages: u32, max_requests: u32, adapter_pages: u32) -> Run {
    by_priority(gpu_pages, host_pages, adapter_pages, |c| {
        c.max_num_requests = max_requests;
    })
}

/// [`Run::with`] under priority.
fn by_priority(gpu: u32, host: u32, adapter_pages: u32, edit: impl FnOnce(&mut Config)) -> Run {
    Run::with(gpu, host, adapter_pages, |c| {
        c.admission = Admission::Priority;
        edit(c);
    })
}

/// Three running requests fill a batch of three; a waiting one of priority 0 takes the place of the
/// lowest priority's newest, which is suspended (a host tier) with its KV kept.
#[test]
fn the_lowest_prioritys_newest_yields_to_a_higher_priority() {
    let mut r = priority(64, 64, 3, 4);
    let x = r.submit(0, 20, 2, None);
    let y = r.submit(1, 20, 3, None);
    let z = r.submit(2, 20, 3, None);
    assert_eq!(r.step().context, [0, 1, 2]);
    let w = r.submit(3, 20, 0, None);
    let refused = r.step();
    assert_eq!(
        (refused.generation.len(), refused.yielded),
        (3, 0),
        "the batch is full: refused"
    );
    let yielded = r.step();
    assert_eq!(yielded.paused, [2], "the lowest priority, newest first");
    assert_eq!(yielded.context, [3]);
    assert_eq!(yielded.yielded, 1);
    assert_eq!(r.ownership(z), Ownership::Paused);
    assert!(r.ownership(w).on_gpu() && r.ownership(x).on_gpu() && r.ownership(y).on_gpu());
}

/// A waiting request of the running requests' priority never preempts them, however long it waits.
#[test]
fn no_preemption_among_equal_priorities() {
    let mut r = priority(64, 64, 2, 4);
    r.submit(0, 20, 1, None);
    r.submit(1, 20, 1, None);
    r.step();
    let w = r.submit(2, 20, 1, None);
    for _ in 0..20 {
        let did = r.step();
        assert_eq!(did.generation, [0, 1]);
        assert!(did.paused.is_empty() && did.recompute.is_empty() && did.yielded == 0);
    }
    assert_eq!(r.ownership(w), Ownership::Waiting);
}

/// A victim keeps its place: when the request it yielded to leaves, it resumes ahead of a newer
/// request of its priority that arrived meanwhile.
#[test]
fn a_victim_keeps_its_place_among_its_priority() {
    let mut r = priority(64, 64, 2, 4);
    r.submit(0, 20, 1, None);
    let v = r.submit(1, 20, 3, None);
    r.step();
    let w = r.submit(2, 20, 0, None);
    r.step();
    assert_eq!(r.step().paused, [1]);
    let newer = r.submit(3, 20, 3, None);
    for _ in 0..3 {
        let did = r.step();
        assert!(
            !did.context.contains(&3) && !did.generation.contains(&1),
            "{did:?}"
        );
    }
    r.s.remove(w).unwrap();
    let did = r.step();
    assert!(
        did.generation.contains(&1),
        "the victim resumes first: {did:?}"
    );
    assert!(r.ownership(v).on_gpu());
    assert_eq!(r.ownership(newer), Ownership::Waiting);
}

/// Preemption only after the waiting request's other checks pass: a whole prompt the token budget
/// cannot hold this pass (no chunking) preempts nobody; neither does a request refused its adapter
/// while the lower priorities hold no other adapter's lease.
#[test]
fn preemption_only_after_the_other_checks_pass() {
    let mut r = by_priority(64, 64, 1, |c| {
        c.max_num_requests = 4;
        c.max_num_tokens = Some(40);
        c.max_context_length = Some(40);
    });
    r.submit(0, 20, 3, None);
    r.submit(1, 20, 3, None);
    r.step();
    // 40 tokens whole: the budget left after two decode steps is 38.
    r.submit(2, 40, 0, None);
    for _ in 0..10 {
        let did = r.step();
        assert!(did.paused.is_empty() && did.recompute.is_empty() && did.yielded == 0);
        assert!(did.context.is_empty());
    }
    // An adapter the device has no room for beside a higher priority's: nobody lower holds a lease.
    let mut r = priority(64, 64, 4, 1);
    r.submit(0, 20, 0, Some(1));
    r.submit(1, 20, 3, None);
    r.step();
    let w = r.submit(2, 20, 1, Some(2));
    for _ in 0..10 {
        let did = r.step();
        assert!(did.paused.is_empty() && did.recompute.is_empty() && did.yielded == 0);
    }
    assert_eq!(r.ownership(w), Ownership::Waiting);
}

/// A LoRA victim: a batch of one holds a priority 3 decode on adapter 1; a priority 0 prompt is refused
/// the batch slot; the victim is suspended, its lease returned (no request holds adapter 1), and when
/// the higher one leaves it resumes with its lease back.
#[test]
fn a_lora_victims_lease_is_released_and_restored() {
    let mut r = priority(64, 64, 1, 4);
    let v = r.submit(0, 20, 3, Some(1));
    r.step();
    let w = r.submit(1, 20, 0, None);
    assert!(r.step().context.is_empty(), "refused the batch slot");
    let did = r.step();
    assert_eq!(
        (did.paused.as_slice(), did.context.as_slice()),
        (&[0][..], &[1][..])
    );
    assert_eq!(r.ownership(v), Ownership::Paused);
    let tasks = r.s.adapters().backend().tasks();
    assert_eq!(
        (tasks[0].active, tasks[0].paused),
        (0, 1),
        "the lease returned"
    );
    r.s.remove(w).unwrap();
    let did = r.step();
    assert_eq!(did.generation, [0], "resumed");
    assert!(r.ownership(v).on_gpu(), "its lease back");
    let tasks = r.s.adapters().backend().tasks();
    assert!(tasks[0].on_device && tasks[0].active == 1);
}

/// A mid-prefill victim: a request of priority 0 is refused the pages a lower priority's unfinished
/// prompt holds; the rest of that pass leaves the prompt where it is, the next pass suspends it
/// mid-prefill (its chunks kept on the host), and it resumes at its position when the pages come back.
#[test]
fn a_mid_prefill_victim_is_suspended_and_resumes_at_its_position() {
    // 7 pages of 16 tokens on the GPU, 64 tokens a pass in chunks of 16.
    let mut r = by_priority(7, 16, 4, |c| {
        c.max_num_tokens = Some(64);
        c.chunking = Some(Chunking {
            policy: ChunkPolicy::FirstComeFirstServed,
            unit: 16,
        });
    });
    let v = r.submit(0, 96, 3, None);
    assert_eq!(r.step().context, [0]);
    assert_eq!(
        r.s.get(v).unwrap().spec().position,
        64,
        "mid-prefill: 4 of 7 pages"
    );
    let w = r.submit(1, 64, 0, None);
    let refused = r.step();
    assert!(
        refused.context.is_empty(),
        "4 pages refused, and the prompt held: {refused:?}"
    );
    let did = r.step();
    assert_eq!(
        (did.paused.as_slice(), did.context.as_slice()),
        (&[0][..], &[1][..])
    );
    assert_eq!(
        (r.ownership(v), r.s.get(v).unwrap().spec().position),
        (Ownership::Paused, 64)
    );
    r.s.remove(w).unwrap();
    let did = r.step();
    assert_eq!(did.context, [0], "resumed at its position");
    assert_eq!(r.s.get(v).unwrap().spec().position, 96);
}

/// The order is by priority, then arrival: a submission joins the end of its priority's requests, and
/// an update of its priority moves it to the end of its new priority's.
#[test]
fn the_order_is_by_priority_then_arrival() {
    let mut r = priority(64, 64, 4, 4);
    for (id, priority) in [(0, 2), (1, 0), (2, 2), (3, 1)] {
        r.submit(id, 20, priority, None);
    }
    let order = |r: &Run| -> Vec<u64> { r.s.requests().map(|(_, e)| e.spec().id.0).collect() };
    assert_eq!(order(&r), [1, 3, 0, 2]);
    let h = r.s.find(kvsched_core::ids::RequestId(0)).unwrap();
    r.s.update(h, |s| s.priority = 1).unwrap();
    assert_eq!(order(&r), [1, 3, 0, 2], "the end of class 1");
    r.s.update(h, |s| s.priority = 0).unwrap();
    assert_eq!(order(&r), [1, 0, 3, 2]);
    assert!(r.s.check());
}

/// A request admitted for its priority keeps lower priorities held back until its prompt is done,
/// also in a pass its step is in flight (pipeline parallelism): in flight it sits the pass out, and its
/// record stands.
#[test]
fn a_finishing_request_in_flight_keeps_lower_priorities_held() {
    // 6 pages of 16 tokens on the GPU, 32 tokens a pass in chunks of 16.
    let mut r = by_priority(6, 16, 4, |c| {
        c.max_num_tokens = Some(32);
        c.chunking = Some(Chunking {
            policy: ChunkPolicy::FirstComeFirstServed,
            unit: 16,
        });
    });
    let v = r.submit(0, 80, 3, None);
    while r.s.get(v).unwrap().spec().phase == kvsched_core::Phase::ContextInit {
        r.step();
    }
    let w = r.submit(1, 64, 0, None);
    assert!(r.step().context.is_empty(), "1 page free: refused");
    let did = r.step();
    assert_eq!(
        (did.paused.as_slice(), did.context.as_slice()),
        (&[0][..], &[1][..])
    );
    assert_eq!(r.s.get(w).unwrap().spec().position, 32, "mid-prefill");
    // Out of the way: a suspended request of its priority ahead would hold it back anyway.
    r.s.remove(v).unwrap();
    let x = r.submit(2, 16, 3, None);
    r.s.set_inflight(w, true).unwrap();
    let in_flight = r.step();
    assert!(
        in_flight.context.is_empty(),
        "priority 3 still held: {in_flight:?}"
    );
    assert_eq!(r.ownership(x), Ownership::Waiting);
    r.s.set_inflight(w, false).unwrap();
    assert_eq!(r.step().context, [1], "its prompt finishes first");
}

/// The device cache holds one adapter: a running request of priority 3 holds task 1's; a request of
/// priority 0 on task 2 is refused its adapter once, then the holder yields (suspended, its lease
/// returned, its adapter paused) and it runs on task 2, evicted task 1's copy making room. Without
/// a lower tier, nothing yields for an adapter (a recompute-paused holder replays and takes it back).
#[test]
fn a_lease_holder_yields_its_adapters_device_pages_to_a_higher_priority() {
    let mut r = priority(64, 64, 4, 1);
    let v = r.submit(0, 20, 3, Some(1));
    r.step();
    let w = r.submit(1, 20, 0, Some(2));
    assert!(r.step().context.is_empty(), "refused its adapter");
    let did = r.step();
    assert_eq!(
        (did.paused.as_slice(), did.context.as_slice()),
        (&[0][..], &[1][..])
    );
    assert_eq!((r.ownership(v), did.yielded), (Ownership::Paused, 1));
    assert!(r.ownership(w).on_gpu());
    let tasks = r.s.adapters().backend().tasks();
    assert!(tasks[1].on_device && tasks[1].active == 1 && !tasks[0].on_device);
    r.s.remove(w).unwrap();
    assert_eq!(
        r.step().generation,
        [0],
        "the holder resumes on its adapter"
    );
    let mut r = priority(64, 0, 4, 1);
    r.submit(0, 20, 3, Some(1));
    r.step();
    r.submit(1, 20, 0, Some(2));
    for _ in 0..3 {
        let did = r.step();
        assert_eq!((did.generation.as_slice(), did.yielded), (&[0][..], 0));
    }
}
