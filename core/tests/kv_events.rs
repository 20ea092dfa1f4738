//! The KV event log (`kv_events`): a committed block is stored on the GPU, with its parent (the
//! request's root for the first); a demoted one is removed from the GPU and stored on the host; a
//! reloaded one the reverse; an evicted one removed. A full log becomes one clear. Attaching a log is
//! refused without a prefix cache, with no room, or twice. The model tests replay every operation's
//! events onto the cache's key set (`testkit`, `replay_kv_events`).

use kvsched_core::kv::{chain, ContextPrep, KvBackend, KvRef, PrefixReuse, Tier};
use kvsched_core::kv_events::{KvEvent, KvEventKind};
use kvsched_core::page_pool::{KvPool, KvPoolConfig};
use kvsched_core::storage::Owned;
use kvsched_core::{Error, RequestId};

const TPB: u32 = 4;
const ROOT: u64 = 77;

fn pool(gpu_pages: u32, host_pages: u32, events: usize) -> KvPool<'static, Owned> {
    let cfg = KvPoolConfig {
        tokens_per_block: TPB,
        gpu_pages,
        host_pages,
        slots: 4,
        max_blocks: 8,
    };
    KvPool::owned_with_prefix_cache(cfg)
        .unwrap()
        .with_kv_events(events)
        .unwrap()
}

fn r(slot: u16) -> KvRef {
    KvRef {
        slot,
        id: RequestId(u64::from(slot) + 1),
    }
}

/// Runs request `slot` over a prompt of `hashes` blocks (and one token more), commits it, frees it.
fn run(p: &mut KvPool<'static, Owned>, slot: u16, hashes: &[u64]) {
    let prompt = hashes.len() as u32 * TPB + 1;
    p.set_prefix(r(slot), ROOT, hashes);
    assert!(p
        .prepare_context(r(slot), ContextPrep::first(prompt))
        .is_some());
    assert!(p.resize_context(r(slot), prompt, true));
    p.commit(r(slot), prompt);
    p.free(r(slot));
}

fn stored(tier: Tier, key: u64, parent: u64) -> KvEvent {
    KvEvent {
        kind: KvEventKind::Stored,
        tier,
        key,
        parent,
    }
}

fn removed(tier: Tier, key: u64) -> KvEvent {
    KvEvent {
        kind: KvEventKind::Removed,
        tier,
        key,
        parent: 0,
    }
}

#[test]
fn commits_demotions_reloads_and_drops_are_logged_in_order() {
    let mut p = pool(3, 2, 64);
    let (a0, a1) = (chain(ROOT, 10), chain(chain(ROOT, 10), 11));
    run(&mut p, 0, &[10, 11]);
    let want = [stored(Tier::Gpu, a0, ROOT), stored(Tier::Gpu, a1, a0)];
    assert_eq!(p.take_kv_events(), &want[..]);
    assert!(p.take_kv_events().is_empty(), "drained");
    // Another prompt of 3 blocks needs every GPU page: the idle blocks are demoted, leaf first.
    let b: Vec<u64> = (20..23).collect();
    p.set_prefix(r(1), ROOT, &b);
    assert_eq!(p.prepare_context(r(1), ContextPrep::first(12)), Some(0));
    assert!(p.resize_context(r(1), 12, true));
    let want = [
        removed(Tier::Gpu, a1),
        stored(Tier::Host, a1, a0),
        removed(Tier::Gpu, a0),
        stored(Tier::Host, a0, ROOT),
    ];
    assert_eq!(p.take_kv_events(), &want[..]);
    p.free(r(1));
    // The first prompt again: its blocks are hits on the host tier, reloaded by the resize.
    p.set_prefix(r(2), ROOT, &[10, 11]);
    assert_eq!(p.prepare_context(r(2), ContextPrep::first(9)), Some(8));
    assert!(p.take_kv_events().is_empty(), "a claim copies nothing");
    assert!(p.resize_context(r(2), 9, true));
    let want = [
        removed(Tier::Host, a0),
        stored(Tier::Gpu, a0, ROOT),
        removed(Tier::Host, a1),
        stored(Tier::Gpu, a1, a0),
    ];
    assert_eq!(p.take_kv_events(), &want[..]);
}

#[test]
fn an_evicted_block_without_a_host_tier_is_removed() {
    let mut p = pool(2, 0, 64);
    let a0 = chain(ROOT, 10);
    run(&mut p, 0, &[10]);
    assert_eq!(p.take_kv_events(), &[stored(Tier::Gpu, a0, ROOT)][..]);
    p.set_prefix(r(1), ROOT, &[20, 21]);
    assert_eq!(p.prepare_context(r(1), ContextPrep::first(8)), Some(0));
    assert!(p.resize_context(r(1), 8, true));
    assert_eq!(p.take_kv_events(), &[removed(Tier::Gpu, a0)][..]);
}

#[test]
fn a_full_log_becomes_one_clear_and_goes_on() {
    let mut p = pool(8, 0, 3);
    let hashes: Vec<u64> = (10..15).collect();
    run(&mut p, 0, &hashes);
    let keys: Vec<u64> = hashes
        .iter()
        .scan(ROOT, |k, &h| {
            *k = chain(*k, h);
            Some(*k)
        })
        .collect();
    // Five stores into three places: the fourth found it full.
    let clear = KvEvent {
        kind: KvEventKind::Cleared,
        ..KvEvent::default()
    };
    let want = [
        clear,
        stored(Tier::Gpu, keys[3], keys[2]),
        stored(Tier::Gpu, keys[4], keys[3]),
    ];
    assert_eq!(p.take_kv_events(), &want[..]);
    assert_eq!(p.kv_event_log(), Some((3, 1)));
}

#[test]
fn a_log_is_refused_without_a_cache_without_room_or_twice() {
    let cfg = KvPoolConfig {
        tokens_per_block: TPB,
        gpu_pages: 4,
        host_pages: 0,
        slots: 4,
        max_blocks: 8,
    };
    let invalid = |got: Result<KvPool<'static, Owned>, Error>| match got {
        Err(Error::Invalid(why)) => why,
        other => panic!("{other:?}"),
    };
    let why = invalid(KvPool::owned(cfg).unwrap().with_kv_events(8));
    assert!(why.contains("prefix cache"), "{why}");
    let with_cache = || KvPool::owned_with_prefix_cache(cfg).unwrap();
    assert!(invalid(with_cache().with_kv_events(0)).contains("room"));
    let once = with_cache().with_kv_events(8).unwrap();
    assert!(invalid(once.with_kv_events(8)).contains("once"));
    let mut used = with_cache();
    run(&mut used, 0, &[1]);
    assert!(invalid(used.with_kv_events(8)).contains("before the cache holds a block"));
    // A pool without a log has no events and no log to report.
    let mut plain = with_cache();
    run(&mut plain, 0, &[1]);
    assert!(plain.take_kv_events().is_empty());
    assert_eq!(plain.kv_event_log(), None);
}
