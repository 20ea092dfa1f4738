//! Property tests of the fixed-capacity arenas under random operation sequences, exhaustion included:
//! page conservation per tier and an independent model of every request's pages (KV pool); residency,
//! refcount and page invariants, and all-or-nothing refusals (adapter cache).

use kvsched::memory::KvMemory;
use kvsched_core::adapter::{AdapterPool, Holding, PeftBackend, TaskRef};
use kvsched_core::kv::Tier;
use kvsched_core::kv::{ContextPrep, KvBackend, KvRef};
use kvsched_core::page_pool::{page_of, KvPoolConfig, SeqState};
use kvsched_core::request::{RequestId, TaskId};
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
        let mut mem = KvMemory::new(cfg);
        let mut kv = mem.pool().unwrap();
        let mut m = [M::default(); 6];
        let blocks = |cap: u32| cap.div_ceil(4);
        for op in ops {
            let r = |s: u16| KvRef { slot: s, id: RequestId(s as u64) };
            let gpu_used: u32 = m.iter().filter(|x| x.state != SeqState::None && !x.on_host).map(|x| blocks(x.capacity)).sum();
            let host_used: u32 = m.iter().filter(|x| x.state != SeqState::None && x.on_host).map(|x| blocks(x.capacity)).sum();
            match op {
                KvOp::Prepare(s) => {
                    let ok = kv.prepare_context(r(s), ContextPrep { first_chunk: true, prompt: 32, position: 0 , lookahead: 0}).is_some();
                    let x = &mut m[s as usize];
                    match x.state {
                        SeqState::None => { prop_assert!(ok); *x = M { state: SeqState::Active, capacity: 0, on_host: false }; }
                        SeqState::Active => prop_assert!(ok),
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
                    match pool.add_request(RequestId(1), tr, from_pause) {
                        Ok(()) => { active[t as usize] += 1; if from_pause { paused[t as usize] -= 1; } }
                        Err(_) => prop_assert_eq!(pool.tasks(), before.tasks(), "refused add changed the cache"),
                    }
                }
                1 if active[t as usize] > 0 => {
                    pool.mark_request_done(RequestId(1), tr, flag, Holding::Lease);
                    active[t as usize] -= 1;
                    if flag { paused[t as usize] += 1; }
                }
                2 if paused[t as usize] > 0 => {
                    pool.mark_request_done(RequestId(1), tr, false, Holding::Paused);
                    paused[t as usize] -= 1;
                }
                3 => {
                    // A batch of every task with an active request plus this one.
                    let batch: Vec<TaskRef> = tasks.iter().copied().filter(|x| active[x.slot as usize] > 0 || x.slot == t).collect();
                    match pool.ensure_batch(&batch, &mut |_| {}) {
                        Ok(()) => for b in &batch { prop_assert!(pool.tasks()[b.slot as usize].on_device); },
                        Err(_) => {
                            prop_assert_eq!(pool.tasks(), before.tasks(), "refused ensure_batch evicted something");
                            let need: u32 = batch.iter().map(|b| b.slot as usize).filter(|&i| !before.tasks()[i].on_device).map(|i| sizes[i]).sum();
                            let obtainable: u32 = 6 - before.device_used()
                                + before.tasks().iter().enumerate().filter(|(i, x)| x.on_device && x.active == 0 && !batch.iter().any(|b| b.slot as usize == *i)).map(|(_, x)| x.pages).sum::<u32>();
                            prop_assert!(need > obtainable, "refused although {} pages were obtainable for {}", obtainable, need);
                        }
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
