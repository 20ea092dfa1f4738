//! Prefix reuse through the whole scheduler on the real pool: a shared prompt is computed once,
//! duplicates in one pass are deferred and then reuse, a finished or recompute-paused request leaves its
//! prefix for others and for its own replay, and the failure modes peers shipped: KV cached under one
//! adapter handed to another adapter or to the base model (vLLM #3264, #8240; llama.cpp #26207), a
//! reloaded adapter reusing blocks cached under its old weights (vLLM #42125), two adapter ids sharing
//! blocks (vLLM #30931: kvsched's adapter identity is its task id and weights version, never a name).

use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::error::PeftError;
use kvsched_core::ids::TaskId;
use kvsched_core::output::SchedulerOutput;
use kvsched_core::page_pool::{KvPool, KvPoolConfig, SeqState};
use kvsched_core::request::RequestSpec;
use kvsched_core::scheduler::{Handle, Scheduler};
use kvsched_core::storage::Owned;
use kvsched_core::{Config, Phase};

type Sched<'a> = Scheduler<KvPool<'a, Owned>, AdapterPool<8>, 16, 8>;
type Out = SchedulerOutput<16>;

/// 16 tokens a page.
const TPB: u32 = 16;

fn config(gpu_pages: u32, host_pages: u32) -> KvPoolConfig {
    KvPoolConfig {
        tokens_per_block: TPB,
        gpu_pages,
        host_pages,
        slots: 16,
        max_blocks: 16,
    }
}

/// A scheduler over a pool of `cfg` with a prefix cache.
fn sched(cfg: KvPoolConfig) -> Sched<'static> {
    let mut adapters = AdapterPool::new(8, 16).unwrap();
    for t in 1..=3 {
        adapters.register(TaskId(t), 1).unwrap();
    }
    Scheduler::new(
        Config::default(),
        KvPool::owned_with_prefix_cache(cfg).unwrap(),
        adapters,
    )
    .unwrap()
}

/// A prompt's block hashes: `shared` blocks of the family, then the request's own.
fn hashes(family: u64, shared: usize, own: u64, n: usize) -> Vec<u64> {
    (0..n as u64)
        .map(|k| {
            if (k as usize) < shared {
                family * 1000 + k
            } else {
                own * 100_000 + k
            }
        })
        .collect()
}

fn submit(
    s: &mut Sched<'_>,
    id: u64,
    lora: Option<u64>,
    salt: u64,
    h: &[u64],
    prompt: u32,
) -> Handle {
    let mut spec = RequestSpec::new(id, Phase::ContextInit, prompt);
    if let Some(t) = lora {
        spec = spec.with_lora(t);
    }
    s.submit_with_prefix(spec, salt, h).unwrap()
}

/// One pass; returns the context chunks scheduled (request id, position when scheduled, tokens).
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

#[test]
fn a_shared_prompt_is_computed_once() {
    let mut s = sched(config(64, 0));
    let mut out = Out::new();
    let h = hashes(1, 6, 0, 6);
    submit(&mut s, 0, None, 0, &h, 100);
    assert_eq!(step(&mut s, &mut out), [(0, 0, 100)]);
    submit(&mut s, 1, None, 0, &h, 100);
    assert_eq!(
        step(&mut s, &mut out),
        [(1, 96, 4)],
        "six blocks reused, the last token and the partial block computed"
    );
    let stats = s.kv().prefix_stats().unwrap();
    assert_eq!((stats.committed, stats.gpu_hits), (6, 6));
}

#[test]
fn duplicates_in_one_pass_are_computed_once() {
    let mut s = sched(config(64, 0));
    let mut out = Out::new();
    let h = hashes(1, 6, 0, 6);
    submit(&mut s, 0, None, 0, &h, 100);
    submit(&mut s, 1, None, 0, &h, 100);
    assert_eq!(step(&mut s, &mut out), [(0, 0, 100)], "1 waits behind 0");
    assert_eq!(s.last_pass().deferred, 1);
    assert_eq!(
        step(&mut s, &mut out),
        [(1, 96, 4)],
        "and reuses its blocks"
    );
}

#[test]
fn kv_under_one_adapter_is_never_reused_under_another_or_the_base_model() {
    let mut s = sched(config(64, 0));
    let mut out = Out::new();
    let h = hashes(1, 6, 0, 6);
    submit(&mut s, 0, Some(1), 0, &h, 100);
    assert_eq!(step(&mut s, &mut out), [(0, 0, 100)]);
    submit(&mut s, 1, Some(2), 0, &h, 100);
    assert_eq!(step(&mut s, &mut out), [(1, 0, 100)], "another adapter id");
    submit(&mut s, 2, None, 0, &h, 100);
    assert_eq!(step(&mut s, &mut out), [(2, 0, 100)], "the base model");
    submit(&mut s, 3, Some(1), 0, &h, 100);
    assert_eq!(
        step(&mut s, &mut out),
        [(3, 96, 4)],
        "the same adapter reuses"
    );
    submit(&mut s, 4, Some(1), 7, &h, 100);
    assert_eq!(step(&mut s, &mut out), [(4, 0, 100)], "another cache salt");
}

#[test]
fn a_reloaded_adapter_never_reuses_its_old_blocks() {
    let mut s = sched(config(64, 0));
    let mut out = Out::new();
    let h = hashes(1, 6, 0, 6);
    let a = submit(&mut s, 0, Some(1), 0, &h, 100);
    step(&mut s, &mut out);
    let waiting = submit(&mut s, 1, Some(1), 0, &h, 100);
    s.set_inflight(waiting, true).unwrap();
    assert_eq!(
        s.reload_adapter(TaskId(1), 1),
        Err(PeftError::TaskBusy(TaskId(1))),
        "a request decodes on it"
    );
    s.remove(a).unwrap();
    assert_eq!(
        s.reload_adapter(TaskId(1), 1),
        Err(PeftError::TaskBusy(TaskId(1))),
        "a waiting request's identity names the old weights"
    );
    s.remove(waiting).unwrap();
    s.reload_adapter(TaskId(1), 1).unwrap();
    submit(&mut s, 2, Some(1), 0, &h, 100);
    assert_eq!(
        step(&mut s, &mut out),
        [(2, 0, 100)],
        "new weights, nothing reused"
    );
    submit(&mut s, 3, Some(1), 0, &h, 100);
    assert_eq!(
        step(&mut s, &mut out),
        [(3, 96, 4)],
        "the new weights' blocks are"
    );
}

#[test]
fn a_finished_request_leaves_its_prefix_and_the_shared_system_prompt_stays() {
    let mut s = sched(config(64, 0));
    let mut out = Out::new();
    // Two conversations on one 4-block system prompt.
    let a = submit(&mut s, 0, Some(1), 0, &hashes(1, 4, 10, 6), 100);
    step(&mut s, &mut out);
    s.remove(a).unwrap();
    submit(&mut s, 1, Some(1), 0, &hashes(1, 4, 11, 6), 100);
    assert_eq!(
        step(&mut s, &mut out),
        [(1, 64, 36)],
        "the system prompt is found"
    );
}

#[test]
fn a_recompute_paused_request_replays_from_its_own_prefix() {
    // No host tier: the first decode step of 1 finds no page and 1 suspends itself (HELD); when 0 needs
    // a page, 1 is recompute-paused. Its committed blocks stay cached, so once 0 finishes, its replay
    // starts from them.
    let mut s = sched(config(10, 0));
    let mut out = Out::new();
    let first = submit(&mut s, 0, None, 0, &hashes(1, 4, 0, 4), 64);
    step(&mut s, &mut out);
    submit(&mut s, 1, None, 0, &hashes(2, 5, 0, 5), 80);
    step(&mut s, &mut out);
    let mut paused = false;
    for _ in 0..64 {
        s.schedule(&mut out).unwrap();
        paused = out
            .recompute_paused()
            .iter()
            .any(|l| s.get(l.handle()).unwrap().spec().id.0 == 1);
        s.ensure_batch(&mut out).unwrap();
        let _ = s.take_moves();
        s.complete_step(&out).unwrap();
        if paused {
            break;
        }
    }
    assert!(paused, "1 was recompute-paused");
    assert_eq!(
        s.kv().prefix_stats().unwrap().evicted,
        1,
        "0's growth took 1's last block"
    );
    s.remove(first).unwrap();
    assert_eq!(
        step(&mut s, &mut out),
        [(1, 64, 16)],
        "the replay reuses four blocks"
    );
}

#[test]
fn a_new_request_in_a_finished_ones_slot_never_uses_its_hashes() {
    let mut s = sched(config(64, 0));
    let mut out = Out::new();
    let h = hashes(1, 6, 0, 6);
    let a = submit(&mut s, 0, None, 0, &h, 100);
    step(&mut s, &mut out);
    s.remove(a).unwrap();
    for (id, adopt) in [(1, true), (2, false)] {
        let spec = RequestSpec::new(id, Phase::ContextInit, 100);
        let b = if adopt {
            s.adopt(spec, kvsched_core::scheduler::Adopt::Waiting)
                .unwrap()
        } else {
            s.submit(spec).unwrap()
        };
        assert_eq!(b.index(), a.index(), "the same slot");
        assert_eq!(
            step(&mut s, &mut out),
            [(id, 0, 100)],
            "no hashes, nothing reused"
        );
        s.remove(b).unwrap();
    }
}

#[test]
fn a_refused_first_chunk_takes_no_block() {
    let mut s = sched(config(12, 0));
    let mut out = Out::new();
    let a = submit(&mut s, 0, None, 0, &hashes(1, 4, 0, 4), 64);
    submit(&mut s, 2, None, 0, &[], 64);
    step(&mut s, &mut out);
    s.remove(a).unwrap();
    // 4 cached idle blocks and 4 free pages; a prompt matching the blocks needs 6 pages more.
    let b = submit(&mut s, 1, None, 0, &hashes(1, 4, 5, 10), 160);
    s.schedule(&mut out).unwrap();
    assert!(out.context().is_empty());
    assert_eq!(
        s.kv().prefix_stats().unwrap().gpu_hits,
        0,
        "its trial refused it before it matched (difference 19)"
    );
    assert_eq!(s.kv().stats().suspends, 0, "nothing to suspend");
    assert_eq!(s.kv().seq(b.index()).state, SeqState::None, "rolled back");
    let cached = s.kv().cached_pages(kvsched_core::kv::Tier::Gpu);
    assert_eq!(cached, 4, "the blocks stay cached, unreferenced");
    let pages = s.kv().config().page_info_len();
    assert!(s.kv().audit(&mut vec![0; pages]));
}

/// A first chunk whose resize is refused after its match claimed a block on the host tier is
/// suspended with its claim; another request that computed the same block then commits it. The pool
/// took the claimed block over as if it were idle and panicked ("an idle host block"); the commit now
/// stops at a block another row claimed and resumes once that row reloads it (found by the grouped
/// prefix caches' random operations, issue 27).
#[test]
fn regression_a_commit_leaves_a_block_another_row_claimed_on_the_host() {
    use kvsched_core::kv::{ContextPrep, KvBackend, KvRef, PrefixReuse};
    let r = |slot: u16| KvRef {
        slot,
        id: kvsched_core::RequestId(u64::from(slot) + 10),
    };
    let mut k = KvPool::owned_with_prefix_cache(KvPoolConfig {
        tokens_per_block: TPB,
        gpu_pages: 4,
        host_pages: 8,
        slots: 4,
        max_blocks: 8,
    })
    .unwrap();
    k.set_prefix(r(1), 1, &[5]);
    k.prepare_context(r(1), ContextPrep::first(17)).unwrap();
    assert!(k.resize_context(r(1), 16, true));
    k.commit(r(1), 16);
    k.free(r(1));
    // Another request takes every GPU page: the cached block goes down to the host tier.
    k.set_prefix(r(3), 9, &[]);
    k.prepare_context(r(3), ContextPrep::first(64)).unwrap();
    assert!(k.resize_context(r(3), 64, true));
    let _ = k.take_moves();
    k.free(r(3));
    // Slot 0 claims it and is suspended before its resize; slot 2 computes the block itself.
    k.set_prefix(r(0), 1, &[5]);
    assert_eq!(k.prepare_context(r(0), ContextPrep::first(17)), Some(16));
    k.suspend(r(0));
    k.set_prefix(r(2), 1, &[5]);
    assert_eq!(k.prepare_context(r(2), ContextPrep::first(17)), Some(0));
    assert!(k.resize_context(r(2), 17, true));
    k.commit(r(2), 16);
    assert!(k.check());
    assert_eq!(
        k.seq(2).committed,
        0,
        "the claimed block is slot 0's to reload"
    );
    // Slot 0 resumes (its claim reloads); slot 2's next commit shares the reloaded block.
    assert_eq!(k.prepare_context(r(0), ContextPrep::first(17)), Some(0));
    assert!(k.resize_context(r(0), 17, false));
    let _ = k.take_moves();
    k.commit(r(2), 16);
    assert_eq!(k.seq(2).committed, 1);
    assert_eq!(k.table(2)[0], k.table(0)[0]);
    assert!(k.check());
}
