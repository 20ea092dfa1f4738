//! Forks (issue 44; `Scheduler::fork`): children share their parent's full blocks by reference and
//! compute only their partial last block; each lives alone from then on; a refused fork changes
//! nothing.

use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::ids::TaskId;
use kvsched_core::output::SchedulerOutput;
use kvsched_core::page_pool::{KvPool, KvPoolConfig};
use kvsched_core::request::RequestSpec;
use kvsched_core::scheduler::{Handle, Scheduler};
use kvsched_core::storage::Owned;
use kvsched_core::{Config, Error, Phase};

type Sched<'a> = Scheduler<KvPool<'a, Owned>, AdapterPool<8>, 16, 8>;
type Out = SchedulerOutput<16>;

const TPB: u32 = 16;

fn config(gpu_pages: u32) -> KvPoolConfig {
    KvPoolConfig {
        tokens_per_block: TPB,
        gpu_pages,
        host_pages: 0,
        slots: 16,
        max_blocks: 16,
    }
}

fn sched(pool: KvPool<'static, Owned>) -> Sched<'static> {
    let mut adapters = AdapterPool::new(8, 16).unwrap();
    adapters.register(TaskId(1), 1).unwrap();
    Scheduler::new(Config::default(), pool, adapters).unwrap()
}

/// One pass and its step; the context chunks scheduled (id, position, tokens); the pool audited.
fn step(s: &mut Sched<'_>, out: &mut Out) -> Vec<(u64, u32, u32)> {
    s.schedule(out).unwrap();
    let chunks = out
        .context()
        .iter()
        .map(|c| {
            let spec = s.get(c.listed.handle()).unwrap().spec();
            (spec.id.0, spec.position, c.tokens)
        })
        .collect();
    s.ensure_batch(out).unwrap();
    let _ = s.take_moves();
    s.complete_step(out).unwrap();
    assert!(s.check());
    let pages = s.kv().config().page_info_len();
    assert!(s.kv().audit(&mut vec![0; pages]), "the pool's audit");
    chunks
}

/// A 100-token prompt (six full blocks and four tokens) computed, its request decoding.
fn decoding_parent(s: &mut Sched<'_>, out: &mut Out, lora: Option<u64>) -> Handle {
    let mut spec = RequestSpec::new(0, Phase::ContextInit, 100);
    spec.lora = lora.map(TaskId);
    let hashes: Vec<u64> = (0..6).collect();
    let h = s.submit_with_prefix(spec, 0, &hashes).unwrap();
    assert_eq!(step(s, out), [(0, 0, 100)]);
    assert_eq!(s.get(h).unwrap().spec().phase, Phase::GenerationInProgress);
    h
}

fn child(id: u64, prompt: u32, lora: Option<u64>) -> RequestSpec {
    let mut spec = RequestSpec::new(id, Phase::ContextInit, prompt);
    spec.lora = lora.map(TaskId);
    spec
}

#[test]
fn children_share_the_prompts_full_blocks_once_and_compute_their_last_block() {
    let mut s = sched(KvPool::owned_with_prefix_cache(config(64)).unwrap());
    let mut out = Out::new();
    let parent = decoding_parent(&mut s, &mut out, Some(1));
    let held = 64 - s.kv().gpu_free();
    let kids: Vec<Handle> = (1..=3)
        .map(|id| s.fork(parent, child(id, 100, Some(1))).unwrap())
        .collect();
    assert_eq!(64 - s.kv().gpu_free(), held, "no page taken by a fork");
    let first = s.kv().seq(parent.index());
    for &k in &kids {
        let e = s.get(k).unwrap();
        assert_eq!(
            (e.spec().phase, e.spec().position),
            (Phase::ContextInit, 96)
        );
        assert_eq!(s.kv().seq(k.index()).blocks, 6);
        assert_eq!(s.kv().seq(k.index()).committed, first.committed.min(6));
    }
    let row = s.kv().table(parent.index());
    for &page in &row[..6] {
        assert_eq!(
            s.kv().page_info(page).unwrap().refs(),
            4,
            "the parent and three children"
        );
    }
    let mut chunks = step(&mut s, &mut out);
    chunks.sort_unstable();
    assert_eq!(
        chunks,
        [(1, 96, 4), (2, 96, 4), (3, 96, 4)],
        "each its last block"
    );
    assert_eq!(
        64 - s.kv().gpu_free(),
        held + 3,
        "the prompt's pages once, a partial block each"
    );
    assert_eq!(
        s.kv().prefix_stats().unwrap().committed,
        6,
        "nothing recommitted"
    );
}

/// A child shorter than its parent takes only its own prompt's block hashes: a replay of it (its
/// prompt then its output) never matches the parent's blocks past its prompt.
#[test]
fn a_shorter_child_takes_only_its_own_blocks_hashes() {
    let mut s = sched(KvPool::owned_with_prefix_cache(config(64)).unwrap());
    let mut out = Out::new();
    let parent = decoding_parent(&mut s, &mut out, None);
    let kid = s.fork(parent, child(1, 40, None)).unwrap();
    let seq = s.kv().seq(kid.index());
    assert_eq!(
        (seq.blocks, seq.hashed),
        (2, 2),
        "40 tokens: two full blocks of 16"
    );
    assert_eq!(s.get(kid).unwrap().spec().position, 32);
}

#[test]
fn the_parent_removed_first_leaves_its_children_whole() {
    let mut s = sched(KvPool::owned_with_prefix_cache(config(64)).unwrap());
    let mut out = Out::new();
    let parent = decoding_parent(&mut s, &mut out, None);
    let kids: Vec<Handle> = (1..=2)
        .map(|id| s.fork(parent, child(id, 100, None)).unwrap())
        .collect();
    s.remove(parent).unwrap();
    let page = s.kv().table(kids[0].index())[0];
    assert_eq!(s.kv().page_info(page).unwrap().refs(), 2);
    for _ in 0..40 {
        step(&mut s, &mut out);
    }
    for k in kids {
        assert!(s.get(k).unwrap().spec().phase.is_generation());
        s.remove(k).unwrap();
    }
    assert_eq!(s.kv().page_info(page).unwrap().refs(), 0, "cached, idle");
    assert_eq!(
        64 - s.kv().gpu_free(),
        6,
        "only the committed prompt blocks stay, cached"
    );
}

#[test]
fn a_refused_fork_changes_nothing() {
    let mut s = sched(KvPool::owned_with_prefix_cache(config(64)).unwrap());
    let mut out = Out::new();
    let waiting = s
        .submit(RequestSpec::new(9, Phase::ContextInit, 50))
        .unwrap();
    let before = s.fingerprint();
    assert!(matches!(
        s.fork(waiting, child(1, 40, None)),
        Err(Error::Invalid(_))
    ));
    assert_eq!(s.fingerprint(), before, "a waiting parent");
    s.remove(waiting).unwrap();
    let parent = decoding_parent(&mut s, &mut out, Some(1));
    let before = s.fingerprint();
    for spec in [
        child(1, 100, None),    // not its adapter
        child(1, 101, Some(1)), // more than it computed
        child(1, 10, Some(1)),  // less than a block to share
        child(0, 100, Some(1)), // a live id
        RequestSpec::generation(1, 100).with_lora(1),
    ] {
        assert!(s.fork(parent, spec.clone()).is_err(), "{spec:?}");
        assert_eq!(s.fingerprint(), before, "{spec:?}");
    }
    assert!(s.check());
}

#[test]
fn without_a_prefix_cache_there_is_no_fork() {
    let mut s = sched(KvPool::owned(config(64)).unwrap());
    let mut out = Out::new();
    let parent = s
        .submit(RequestSpec::new(0, Phase::ContextInit, 100))
        .unwrap();
    step(&mut s, &mut out);
    let before = s.fingerprint();
    assert!(matches!(
        s.fork(parent, child(1, 100, None)),
        Err(Error::Invalid(_))
    ));
    assert_eq!(s.fingerprint(), before);
}

/// GUARANTEED_NO_EVICT counts a child's shared pages once: a parent and three children of a
/// 100-token prompt (six shared pages, 20 tokens each to generate) run side by side in 16 pages, where
/// four separate requests (eight pages each) could not, and nobody is evicted.
#[test]
fn guaranteed_no_evict_reserves_each_childs_own_growth_only() {
    let no_evict = Config {
        policy: kvsched_core::config::CapacityPolicy::GuaranteedNoEvict,
        ..Config::default()
    };
    let mut adapters = AdapterPool::new(8, 16).unwrap();
    adapters.register(TaskId(1), 1).unwrap();
    let pool = KvPool::owned_with_prefix_cache(config(16)).unwrap();
    let mut s: Sched<'static> = Scheduler::new(no_evict, pool, adapters).unwrap();
    let mut out = Out::new();
    let mut spec = RequestSpec::new(0, Phase::ContextInit, 100);
    spec.max_new_tokens = 20;
    let hashes: Vec<u64> = (0..6).collect();
    let parent = s.submit_with_prefix(spec, 0, &hashes).unwrap();
    assert_eq!(step(&mut s, &mut out), [(0, 0, 100)]);
    let kids: Vec<Handle> = (1..=3)
        .map(|id| {
            let mut c = child(id, 100, None);
            c.max_new_tokens = 20;
            s.fork(parent, c).unwrap()
        })
        .collect();
    let mut decoding = 0;
    for _ in 0..25 {
        step(&mut s, &mut out);
        let p = s.last_pass();
        assert_eq!((p.victims, p.self_evictions, p.recompute_pauses), (0, 0, 0));
        decoding = decoding.max(out.generation().len());
    }
    assert_eq!(
        decoding, 4,
        "the parent and its three children decode side by side"
    );
    for h in kids.into_iter().chain([parent]) {
        assert!(s.get(h).unwrap().spec().phase.is_generation());
    }
}
