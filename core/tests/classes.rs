//! Service classes (issue 45; `Config::shares`, `scheduler/classes.rs`): a class within its share takes
//! a batch slot, KV or adapter pages back from a borrowing class's requests; an unused share is lent;
//! a request larger than its class's share claims nothing; a claim for adapter pages makes nobody
//! yield.

use kvsched_core::config::{CapacityPolicy, Share, SERVICE_CLASSES};
use kvsched_core::request::Ownership;
use kvsched_core::Config;

mod support;

use support::run::Run;

/// Class 0 (latency) has `share`; class 1 (throughput) none.
fn classes(share: Share) -> [Share; SERVICE_CLASSES] {
    [share, Share::default(), Share::default(), Share::default()]
}

/// A batch of `batch` and class 0's share of batch slots `slots`, a host tier.
fn slots(batch: u32, slots: u32) -> Run {
    Run::with(64, 64, 4, |c: &mut Config| {
        c.max_num_requests = batch;
        c.shares = Some(classes(Share {
            requests: slots,
            ..Share::default()
        }));
    })
}

const LATENCY: (u8, u8) = (0, 0);
const THROUGHPUT: (u8, u8) = (0, 1);

/// Unused, class 0's share is lent: class 1 fills the batch.
#[test]
fn an_unused_share_is_lent() {
    let mut r = slots(3, 2);
    for id in 0..3 {
        r.submit_in(id, 20, THROUGHPUT, None);
    }
    assert_eq!(r.step().context, [0, 1, 2]);
}

/// Class 1's backlog fills the batch; a class 0 request within its share is refused once, then the
/// newest borrower yields (suspended, its KV kept on the host) and it runs; class 1's backlog waits.
#[test]
fn a_class_within_its_share_takes_a_batch_slot_back() {
    let mut r = slots(3, 1);
    for id in 0..5 {
        r.submit_in(id, 20, THROUGHPUT, None);
    }
    assert_eq!(r.step().context, [0, 1, 2]);
    let w = r.submit_in(9, 20, LATENCY, None);
    let refused = r.step();
    assert_eq!((refused.generation.len(), refused.yielded), (3, 0));
    let claimed = r.step();
    assert_eq!(claimed.paused, [2], "the newest borrower yields");
    assert_eq!(claimed.context, [9], "class 1's backlog waits: {claimed:?}");
    assert_eq!(claimed.yielded, 1);
    assert!(r.ownership(w).on_gpu());
    // At its share, class 0 is no borrower: class 1 takes nothing back from it.
    for _ in 0..4 {
        let did = r.step();
        assert!(did.generation.contains(&9) && did.yielded == 0, "{did:?}");
    }
}

/// Without a lower tier nothing yields to a class, and nothing is held: the reference's rules.
#[test]
fn without_a_host_tier_nothing_yields_to_a_class() {
    let mut r = Run::with(6, 0, 4, |c: &mut Config| {
        c.shares = Some(classes(Share {
            kv_tokens: 64,
            ..Share::default()
        }));
    });
    r.submit_in(0, 32, THROUGHPUT, None);
    r.submit_in(1, 32, THROUGHPUT, None);
    r.step();
    r.submit_in(9, 20, LATENCY, None);
    for _ in 0..3 {
        assert_eq!(r.step().yielded, 0);
    }
}

/// A second class 0 request would take its class past its share: it waits like any other.
#[test]
fn a_request_past_its_classes_share_claims_nothing() {
    let mut r = slots(2, 1);
    r.submit_in(0, 20, LATENCY, None);
    r.submit_in(1, 20, THROUGHPUT, None);
    r.step();
    let w = r.submit_in(2, 20, LATENCY, None);
    for _ in 0..6 {
        let did = r.step();
        assert!(did.paused.is_empty() && did.yielded == 0, "{did:?}");
    }
    assert_eq!(r.ownership(w), Ownership::Waiting);
}

/// KV: class 1's requests hold the GPU's pages; a class 0 request within its share of KV tokens is
/// refused pages, then the newest borrower is suspended to the host and class 0's request is admitted
/// before class 1's waiting one.
#[test]
fn a_class_within_its_share_takes_kv_back() {
    let mut r = Run::with(6, 64, 4, |c: &mut Config| {
        c.shares = Some(classes(Share {
            kv_tokens: 64,
            ..Share::default()
        }));
    });
    // 32 + 16 tokens each: three pages of 16 tokens with the first decode step.
    r.submit_in(0, 32, THROUGHPUT, None);
    r.submit_in(1, 32, THROUGHPUT, None);
    assert_eq!(r.step().context, [0, 1]);
    r.submit_in(2, 20, THROUGHPUT, None);
    r.submit_in(9, 20, LATENCY, None);
    let mut admitted = None;
    for pass in 0..4 {
        let did = r.step();
        assert!(
            !did.context.contains(&2),
            "class 1's backlog waits: {did:?}"
        );
        if did.context.contains(&9) {
            assert_eq!(did.paused, [1], "the newest borrower yields: {did:?}");
            admitted = Some(pass);
            break;
        }
    }
    assert!(admitted.is_some(), "class 0's request was never admitted");
}

/// Adapter pages: class 1 holds the device's one adapter page; class 0's request for another adapter
/// is refused, and nothing yields for it (a yield for an adapter over-commits the device), but class
/// 1's new LoRA requests wait, so the adapter comes free and class 0's request runs first.
#[test]
fn a_claim_for_adapter_pages_holds_new_adapters_and_yields_nothing() {
    let mut r = Run::with(64, 64, 1, |c: &mut Config| {
        c.shares = Some(classes(Share {
            adapter_pages: 1,
            ..Share::default()
        }));
    });
    let holder = r.submit_in(0, 20, THROUGHPUT, Some(1));
    r.step();
    r.submit_in(9, 20, LATENCY, Some(2));
    r.submit_in(1, 20, THROUGHPUT, Some(1));
    for _ in 0..4 {
        let did = r.step();
        assert_eq!(did.generation, [0], "{did:?}");
        assert!(did.context.is_empty() && did.yielded == 0, "{did:?}");
    }
    r.s.remove(holder).unwrap();
    assert_eq!(r.step().context, [9]);
}

/// GUARANTEED_NO_EVICT: a claim holds class 1's backlog and evicts nobody.
#[test]
fn under_guaranteed_no_evict_a_claim_only_holds() {
    let mut r = Run::with(64, 64, 4, |c: &mut Config| {
        c.policy = CapacityPolicy::GuaranteedNoEvict;
        c.max_num_requests = 2;
        c.shares = Some(classes(Share {
            requests: 1,
            ..Share::default()
        }));
    });
    let first = r.submit_in(0, 20, THROUGHPUT, None);
    r.submit_in(1, 20, THROUGHPUT, None);
    r.step();
    r.submit_in(2, 20, THROUGHPUT, None);
    r.submit_in(9, 20, LATENCY, None);
    for _ in 0..3 {
        let did = r.step();
        assert!(did.paused.is_empty() && did.recompute.is_empty() && did.yielded == 0);
    }
    r.s.remove(first).unwrap();
    let did = r.step();
    assert_eq!(
        did.context,
        [9],
        "class 0 first, then class 1's backlog: {did:?}"
    );
}

/// Shares of batch slots past the batch, and a class past the last, are refused.
#[test]
fn shares_past_the_batch_and_classes_past_the_last_are_refused() {
    let cfg = Config {
        max_num_requests: 4,
        shares: Some(classes(Share {
            requests: 5,
            ..Share::default()
        })),
        ..Config::default()
    };
    assert!(cfg.validate().is_err());
    let mut r = slots(4, 1);
    let mut spec = kvsched_core::RequestSpec::new(1, kvsched_core::Phase::ContextInit, 8);
    spec.class = SERVICE_CLASSES as u8;
    assert!(r.s.submit(spec).is_err());
    assert!(r.s.check());
}

/// A new request may change its service class (nothing of it is charged yet); once it owns KV its
/// class is fixed; a class past the last is refused and changes nothing.
#[test]
fn a_new_request_may_change_its_class_and_a_running_one_may_not() {
    let mut r = slots(4, 1);
    let h = r.submit_in(1, 8, THROUGHPUT, None);
    assert!(r.s.update(h, |s| s.class = SERVICE_CLASSES as u8).is_err());
    assert_eq!(r.s.get(h).ok().map(|e| e.spec().class), Some(1));
    r.s.update(h, |s| s.class = 0).unwrap();
    assert_eq!(r.s.get(h).ok().map(|e| e.spec().class), Some(0));
    r.step();
    assert!(r.ownership(h).on_gpu());
    r.s.update(h, |s| s.class = 2).unwrap();
    assert_eq!(
        r.s.get(h).ok().map(|e| e.spec().class),
        Some(0),
        "fixed once it runs"
    );
    assert!(r.s.check());
}
