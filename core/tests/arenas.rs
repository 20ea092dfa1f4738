//! Property tests of the fixed-capacity arenas under random operation sequences, exhaustion included:
//! page conservation per tier and an independent model of every request's pages (KV pool); residency,
//! refcount and page invariants, and all-or-nothing refusals (adapter cache).

use kvsched_core::adapter::{AdapterHold, PeftBackend, TaskRef};
use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::ids::{RequestId, TaskId};
use kvsched_core::kv::Tier;
use kvsched_core::kv::{ContextPrep, KvBackend, KvRef, PrefixReuse};
use kvsched_core::page_pool::{page_of, KvPool, KvPoolConfig, SeqState};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum KvOp {
    Prepare(u16),
    Resize(u16, u32),
    Grow(u16, u32),
    Revert(u16),
    Suspend(u16),
    Free(u16),
}

fn kv_op() -> impl Strategy<Value = KvOp> {
    let slot = 0u16..6;
    prop_oneof![
        slot.clone().prop_map(KvOp::Prepare),
        (slot.clone(), 1u32..40).prop_map(|(s, n)| KvOp::Resize(s, n)),
        (slot.clone(), 1u32..6).prop_map(|(s, n)| KvOp::Grow(s, n)),
        slot.clone().prop_map(KvOp::Revert),
        slot.clone().prop_map(KvOp::Suspend),
        slot.prop_map(KvOp::Free),
    ]
}

/// Independent model: per slot, (state, capacity, on_host).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct M {
    state: SeqState,
    capacity: u32,
    on_host: bool,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn kv_pool_conserves_pages_and_matches_its_model(host in prop_oneof![Just(0u32), Just(6), Just(24)], ops in prop::collection::vec(kv_op(), 1..120)) {
        let cfg = KvPoolConfig { tokens_per_block: 4, gpu_pages: 12, host_pages: host, slots: 6, max_blocks: 8 };
        let mut kv = KvPool::owned(cfg).unwrap();
        let mut m = [M::default(); 6];
        let blocks = |cap: u32| cap.div_ceil(4);
        for op in ops {
            let r = |s: u16| KvRef { slot: s, id: RequestId(s as u64) };
            let gpu_used: u32 = m.iter().filter(|x| x.state != SeqState::None && !x.on_host).map(|x| blocks(x.capacity)).sum();
            let host_used: u32 = m.iter().filter(|x| x.state != SeqState::None && x.on_host).map(|x| blocks(x.capacity)).sum();
            match op {
                KvOp::Prepare(s) => {
                    let ok = kv.prepare_context(r(s), ContextPrep::first(32)).is_some();
                    let x = &mut m[s as usize];
                    match x.state {
                        SeqState::None => { prop_assert!(ok); *x = M { state: SeqState::Active, capacity: 0, on_host: false }; }
                        SeqState::Active | SeqState::Claimed => prop_assert!(ok),
                        SeqState::Suspended => {
                            let fits = !x.on_host || blocks(x.capacity) <= 12 - gpu_used;
                            prop_assert_eq!(ok, fits);
                            if ok { x.state = SeqState::Active; x.on_host = false; }
                        }
                    }
                }
                KvOp::Resize(s, n) => {
                    let ok = kv.resize_context(r(s), n, false);
                    let x = &mut m[s as usize];
                    let want = x.state == SeqState::Active
                        && (n <= x.capacity || (blocks(n) <= 8 && blocks(n) - blocks(x.capacity) <= 12 - gpu_used));
                    prop_assert_eq!(ok, want);
                    if ok { x.capacity = x.capacity.max(n); }
                }
                KvOp::Grow(s, n) => {
                    let ok = kv.try_allocate_generation(r(s), n);
                    let x = &mut m[s as usize];
                    let target = x.capacity + n;
                    let need_now = if x.state == SeqState::Suspended && x.on_host { blocks(target) } else { blocks(target) - blocks(x.capacity) };
                    let want = x.state != SeqState::None && blocks(target) <= 8 && need_now <= 12 - gpu_used;
                    prop_assert_eq!(ok, want, "grow {} by {}: {:?}", s, n, x);
                    if ok { *x = M { state: SeqState::Active, capacity: target, on_host: false }; }
                }
                KvOp::Revert(s) => {
                    let before = kv.seq(s);
                    kv.revert_allocate_generation(r(s));
                    if before.state == SeqState::Active && before.last_grow > 0 {
                        m[s as usize].capacity -= before.last_grow;
                    }
                }
                KvOp::Suspend(s) => {
                    kv.suspend(r(s));
                    let x = &mut m[s as usize];
                    if x.state == SeqState::Active {
                        x.state = SeqState::Suspended;
                        let b = blocks(x.capacity);
                        x.on_host = b > 0 && host > 0 && b <= host - host_used;
                    }
                }
                KvOp::Free(s) => {
                    kv.free(r(s));
                    m[s as usize] = M::default();
                }
            }
            prop_assert!(kv.audit(&mut vec![0; kv.config().page_info_len()]), "page conservation per tier");
            for s in 0..6u16 {
                let q = kv.seq(s);
                let x = m[s as usize];
                prop_assert_eq!(q.state, x.state);
                if x.state != SeqState::None {
                    prop_assert_eq!(q.capacity, x.capacity);
                    let want = if x.on_host { Tier::Host } else { Tier::Gpu };
                    prop_assert!(kv.table(s).iter().all(|&e| page_of(e).0 == want), "slot {} tier", s);
                    prop_assert_eq!(q.blocks, blocks(x.capacity));
                }
            }
            // No page is in two tables, and no table page is free.
            let mut owner = std::collections::HashMap::new();
            for s in 0..6u16 {
                for (tier, p) in kv.table(s).iter().map(|&e| page_of(e)) {
                    prop_assert!(owner.insert((tier as u8, p), s).is_none(), "page {:?} owned twice", (tier, p));
                }
            }
            let moves = kv.take_moves().len();
            let _ = moves;
        }
    }

    #[test]
    fn adapter_cache_keeps_its_invariants_and_refusals_change_nothing(ops in prop::collection::vec((0u8..4, 0u16..5, any::<bool>()), 1..150)) {
        let mut pool: AdapterPool<8> = AdapterPool::new(6, 8).unwrap();
        let sizes = [1u32, 2, 3, 4, 2];
        let tasks: Vec<TaskRef> = sizes.iter().enumerate().map(|(i, &p)| pool.register(TaskId(i as u64), p).unwrap()).collect();
        // Our own books: per task, (active, paused) registrations.
        let mut active = [0u32; 5];
        let mut paused = [0u32; 5];
        for (kind, t, flag) in ops {
            let tr = tasks[t as usize];
            let before = pool.clone();
            match kind {
                0 => {
                    let from_pause = flag && paused[t as usize] > 0;
                    if let Ok(()) = pool.add_request(RequestId(1), tr, from_pause) { active[t as usize] += 1; if from_pause { paused[t as usize] -= 1; } } else { prop_assert_eq!(pool.tasks(), before.tasks(), "refused add changed the cache") }
                }
                1 if active[t as usize] > 0 => {
                    pool.mark_request_done(RequestId(1), tr, flag, AdapterHold::Lease);
                    active[t as usize] -= 1;
                    if flag { paused[t as usize] += 1; }
                }
                2 if paused[t as usize] > 0 => {
                    pool.mark_request_done(RequestId(1), tr, false, AdapterHold::Paused);
                    paused[t as usize] -= 1;
                }
                3 => {
                    // A batch of every task with an active request plus this one.
                    let batch: Vec<TaskRef> = tasks.iter().copied().filter(|x| active[x.slot.index()] > 0 || x.slot.0 == t).collect();
                    if let Ok(()) = pool.ensure_batch(&batch, &mut |_| {}) { for b in &batch { prop_assert!(pool.tasks()[b.slot.index()].on_device); } } else {
                        prop_assert_eq!(pool.tasks(), before.tasks(), "refused ensure_batch evicted something");
                        let need: u32 = batch.iter().map(|b| b.slot.index()).filter(|&i| !before.tasks()[i].on_device).map(|i| sizes[i]).sum();
                        let obtainable: u32 = 6 - before.device_used()
                            + before.tasks().iter().enumerate().filter(|(i, x)| x.on_device && x.active == 0 && !batch.iter().any(|b| b.slot.index() == *i)).map(|(_, x)| x.pages).sum::<u32>();
                        prop_assert!(need > obtainable, "refused although {} pages were obtainable for {}", obtainable, need);
                    }
                }
                _ => {}
            }
            prop_assert!(pool.check());
            for (i, x) in pool.tasks().iter().enumerate() {
                prop_assert_eq!(x.active, active[i]);
                prop_assert_eq!(x.paused, paused[i]);
                if x.active > 0 || x.paused > 0 { prop_assert!(x.on_host, "a registered task lost its host copy"); }
            }
            let _ = pool.max_device_pages();
        }
    }
}

fn cases() -> u32 {
    std::env::var("KVSCHED_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// An operation on a pool with a prefix cache.
#[derive(Debug, Clone)]
enum PrefixOp {
    /// A first chunk: root (adapter) A or B, a prompt family, the block where it leaves the family for
    /// its own tail, its length in tokens, and whether the engine also hashed the partial last block.
    Start {
        slot: u16,
        root_b: bool,
        family: u64,
        diverge: u32,
        prompt: u32,
        partial: bool,
    },
    Grow(u16, u32),
    Suspend(u16),
    Free(u16),
}

fn prefix_op() -> impl Strategy<Value = PrefixOp> {
    let slot = 0u16..6;
    prop_oneof![
        3 => (slot.clone(), any::<bool>(), 0u64..3, 0u32..8, 1u32..33, any::<bool>()).prop_map(
            |(slot, root_b, family, diverge, prompt, partial)| PrefixOp::Start { slot, root_b, family, diverge, prompt, partial }
        ),
        2 => (slot.clone(), 1u32..9).prop_map(|(s, n)| PrefixOp::Grow(s, n)),
        1 => slot.clone().prop_map(PrefixOp::Suspend),
        2 => slot.prop_map(PrefixOp::Free),
    ]
}

/// What each page holds: the key of the prompt block written into it, or a private tag (decode tokens,
/// the partial block, unhashed blocks). Follows the pool's move log.
#[derive(Debug, Default)]
struct Contents {
    pages: std::collections::HashMap<(Tier, u32), u64>,
    next_tag: u64,
}

impl Contents {
    fn write(&mut self, entry: u32, what: u64) {
        self.pages.insert(page_of(entry), what);
    }
    fn private_tag(&mut self) -> u64 {
        self.next_tag += 1;
        u64::MAX - self.next_tag
    }
    fn read(&self, entry: u32) -> Option<u64> {
        self.pages.get(&page_of(entry)).copied()
    }
    fn apply(&mut self, moves: &[kvsched_core::kv::PageMove]) {
        for m in moves {
            let v = self.pages.get(&(m.from, m.src)).copied();
            let to = match m.from {
                Tier::Gpu => Tier::Host,
                Tier::Host => Tier::Gpu,
            };
            if let Some(v) = v {
                self.pages.insert((to, m.dst), v);
            }
        }
    }
}

/// The chain keys of a prompt's blocks.
fn keys(root: u64, hashes: &[u64]) -> Vec<u64> {
    let mut key = root;
    hashes
        .iter()
        .map(|&h| {
            key = kvsched_core::kv::chain(key, h);
            key
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// Random first chunks over shared prompt families under two adapters, growth, suspension and
    /// frees, with eviction, demotion and reload under pressure: the audit (reference counts, free
    /// pages, the cache's own invariants) holds after every operation; a match only ever hands out pages
    /// holding exactly the matched blocks; nothing is ever written into a page another row or the cache
    /// holds; every cached page holds the block of its key.
    #[test]
    fn prefix_cache_shares_only_what_it_holds(host in prop_oneof![Just(0u32), Just(5), Just(16)], ops in prop::collection::vec(prefix_op(), 1..150)) {
        let cfg = KvPoolConfig { tokens_per_block: 4, gpu_pages: 14, host_pages: host, slots: 6, max_blocks: 10 };
        let mut kv = KvPool::owned_with_prefix_cache(cfg).unwrap();
        let mut scratch = vec![0u32; cfg.page_info_len()];
        let mut contents = Contents::default();
        let mut prompt_keys: Vec<Vec<u64>> = vec![Vec::new(); 6];
        let r = |s: u16| KvRef { slot: s, id: RequestId(s as u64) };
        for op in ops {
            match op {
                PrefixOp::Start { slot, root_b, family, diverge, prompt, partial } => {
                    if kv.cache(r(slot)).exists() {
                        continue;
                    }
                    let root = if root_b { 0xb } else { 0xa };
                    let n = (prompt / 4 + u32::from(partial && prompt % 4 != 0)) as u64;
                    let hashes: Vec<u64> = (0..n)
                        .map(|k| if k < u64::from(diverge) { family * 100 + k } else { contents.private_tag() })
                        .collect();
                    kv.set_prefix(r(slot), root, &hashes);
                    let want = keys(root, &hashes);
                    let prep = ContextPrep::first(prompt);
                    let reused = kv.prepare_context(r(slot), prep).expect("a free slot");
                    prop_assert!(reused % 4 == 0 && reused < prompt.max(1), "reused {} of {}", reused, prompt);
                    contents.apply(kv.take_moves());
                    for (k, &e) in kv.table(slot).iter().enumerate() {
                        prop_assert_eq!(contents.read(e), Some(want[k]), "matched block {} holds another block", k);
                    }
                    if kv.resize_context(r(slot), prompt, true) {
                        contents.apply(kv.take_moves());
                        // The prefill writes the blocks it did not reuse.
                        let full = (prompt / 4) as usize;
                        for k in (reused / 4) as usize..kv.table(slot).len() {
                            let e = kv.table(slot)[k];
                            let info = kv.page_info(e).unwrap();
                            prop_assert!(info.refs() == 1 && !info.cached(), "block {} written into a shared page", k);
                            let what = if k < full && k < want.len() { want[k] } else { contents.private_tag() };
                            contents.write(e, what);
                        }
                        kv.commit(r(slot), prompt);
                        prompt_keys[slot as usize] = want;
                    } else {
                        kv.free(r(slot));
                    }
                }
                PrefixOp::Grow(slot, n) => {
                    let before = kv.table(slot).len();
                    if kv.try_allocate_generation(r(slot), n) {
                        contents.apply(kv.take_moves());
                        for k in before..kv.table(slot).len() {
                            let e = kv.table(slot)[k];
                            let info = kv.page_info(e).unwrap();
                            prop_assert!(info.refs() == 1 && !info.cached(), "decode written into a shared page");
                            let tag = contents.private_tag();
                            contents.write(e, tag);
                        }
                    }
                }
                PrefixOp::Suspend(slot) => kv.suspend(r(slot)),
                PrefixOp::Free(slot) => kv.free(r(slot)),
            }
            contents.apply(kv.take_moves());
            prop_assert!(kv.audit(&mut scratch), "the pool's audit");
            for slot in 0..6u16 {
                let seq = kv.seq(slot);
                let committed = kv.table(slot).iter().zip(&prompt_keys[slot as usize]).take(seq.committed as usize);
                for (k, (&e, &key)) in committed.enumerate() {
                    prop_assert_eq!(contents.read(e), Some(key), "slot {} committed block {}", slot, k);
                }
            }
            for tier in [Tier::Gpu, Tier::Host] {
                let pages = if tier == Tier::Gpu { cfg.gpu_pages } else { cfg.host_pages };
                for p in 0..pages {
                    let e = if tier == Tier::Gpu { p } else { p | kvsched_core::page_pool::HOST };
                    let info = kv.page_info(e).unwrap();
                    if info.cached() {
                        prop_assert_eq!(contents.read(e), Some(info.key()), "cached {:?} page {} holds another block", tier, p);
                    }
                }
            }
        }
    }
}
