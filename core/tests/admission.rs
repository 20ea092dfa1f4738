//! Admission policies beyond the reference, as properties of a serving loop on the real pools: under
//! `vtc` and `deadline` no request waits forever when the system is not overloaded — the token and
//! request budgets hold every arrival, and the only contention is the adapter cache — even while
//! requests of resident adapters keep arriving (SGLang #15129, vLLM #16876). FCFS, the reference,
//! can starve such a request; `tests` in `core/src/scheduler/admission.rs` shows the case.

use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::config::Admission;
use kvsched_core::ids::TaskId;
use kvsched_core::output::SchedulerOutput;
use kvsched_core::page_pool::{KvPool, KvPoolConfig};
use kvsched_core::request::RequestSpec;
use kvsched_core::scheduler::{Handle, Scheduler};
use kvsched_core::storage::Owned;
use kvsched_core::{Config, Phase};
use proptest::prelude::*;

type Sched<'a> = Scheduler<KvPool<'a, Owned>, AdapterPool<8>, 16, 8>;

/// One arrival: prompt tokens, output tokens, adapter (None: base model), tenant, class.
type Arrival = (u32, u32, Option<u8>, Option<u32>, u8);

fn arrival() -> impl Strategy<Value = Arrival> {
    (
        1u32..=32,
        1u32..=8,
        prop::option::weighted(0.9, 0u8..6),
        prop::option::weighted(0.3, 0u32..3),
        0u8..4,
    )
}

/// Passes from submission to the first chunk, per request, of a loop that submits one arrival a pass
/// (while the table has room) and then drains; `None` if some request never got in.
fn waits(admission: Admission, arrivals: &[Arrival], device_pages: u32) -> Option<Vec<u64>> {
    let kv = KvPool::owned(KvPoolConfig {
        tokens_per_block: 4,
        gpu_pages: 512,
        host_pages: 0,
        slots: 16,
        max_blocks: 16,
    })
    .unwrap();
    let mut adapters = AdapterPool::new(device_pages, 64).unwrap();
    for t in 0..6u32 {
        // Sizes 1 to 3 pages; each fits the device alone.
        adapters.register(TaskId(u64::from(t)), 1 + t % 3).unwrap();
    }
    let cfg = Config {
        max_num_requests: 16,
        max_num_tokens: Some(512),
        max_context_length: Some(512),
        admission,
        drain_after: 4,
        ..Config::default()
    };
    let mut s: Sched<'_> = Scheduler::new(cfg, kv, adapters).unwrap();
    let mut out = SchedulerOutput::<16>::new();
    let mut live: Vec<(Handle, u64, u32, Option<u64>)> = Vec::new(); // (handle, submitted, output, admitted)
    let mut done = Vec::new();
    let mut next = 0;
    for pass in 0u64..600 {
        if next < arrivals.len() && s.len() < 15 {
            let (prompt, output, adapter, tenant, class) = arrivals[next];
            let mut r = RequestSpec::new(next as u64, Phase::ContextInit, prompt);
            r.lora = adapter.map(|a| TaskId(u64::from(a)));
            r.tenant = tenant;
            r.priority = class;
            r.arrival = pass * 1000;
            r.max_new_tokens = output;
            live.push((s.submit(r).unwrap(), pass, output, None));
            next += 1;
        }
        s.schedule(&mut out).unwrap();
        s.ensure_batch(&mut out).unwrap();
        let _ = s.take_moves();
        for c in out.context() {
            if let Some(l) = live.iter_mut().find(|l| l.0 == c.listed.handle()) {
                l.3.get_or_insert(pass);
            }
        }
        let decoded: Vec<Handle> = out.generation().iter().map(|l| l.handle()).collect();
        s.complete_step(&out).unwrap();
        assert!(s.check());
        for l in &mut live {
            if decoded.contains(&l.0) {
                l.2 -= 1;
            }
        }
        live.retain(|l| {
            let finished = l.2 == 0;
            if finished {
                s.remove(l.0).unwrap();
                done.push(l.3.unwrap() - l.1);
            }
            !finished
        });
        if next == arrivals.len() && live.is_empty() {
            return Some(done);
        }
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Every request of a finite workload is admitted and finishes within the loop's horizon (600
    /// passes), under both fair policies: no order they choose, and no drain, leaves a request behind
    /// or livelocks.
    #[test]
    fn no_request_waits_forever_under_a_fair_policy(
        arrivals in prop::collection::vec(arrival(), 1..120),
        device_pages in 3u32..=6,
    ) {
        let deadline = Admission::Deadline { ttft: [1_000, 4_000, 16_000, 64_000] };
        for admission in [Admission::VTC, deadline] {
            let w = waits(admission, &arrivals, device_pages);
            prop_assert!(w.is_some(), "{admission:?}: a request never finished");
        }
    }
}

/// The failure mode itself: adapter 1's requests keep arriving and always have one running, while an
/// adapter-2 request waits for the one-adapter device. FCFS admits every adapter-1 arrival ahead of
/// it and it never gets in; under vtc and deadline it is admitted after the drain.
#[test]
fn a_blocked_adapter_gets_in_under_a_fair_policy_only() {
    let stream: Vec<Arrival> = (0..300)
        .map(|i| {
            if i == 1 {
                (8, 4, Some(2), None, 0)
            } else {
                (8, 8, Some(1), None, 0)
            }
        })
        .collect();
    let deadline = Admission::Deadline { ttft: [0; 4] };
    // A device of 3 pages holds adapter 1 (2 pages) or adapter 2 (3 pages), not both.
    assert!(waits(Admission::Fcfs, &stream, 3).is_none_or(|w| w.iter().any(|&p| p > 150)));
    for admission in [Admission::VTC, deadline] {
        let w = waits(admission, &stream, 3).expect("everything finishes");
        assert!(w.iter().all(|&p| p <= 150), "{admission:?}: {w:?}");
    }
}
