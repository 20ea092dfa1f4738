//! The prefix cache's unit tests: matching, sharing, reference counts, eviction leaf first and least
//! recently used, demotion to the host tier and reload, deduplication at commit, and isolation by root.
use super::*;
use crate::ids::RequestId;
use crate::kv::{chain, ContextPrep, KvBackend, KvCaps, KvRef, PrefixReuse};
use crate::testing::{Mem, PrefixMem};

/// 8 GPU pages, up to 8 host pages, 4 slots of 4 pages, 4 tokens a page.
type Buf = Mem<8, 8, 4, 16, 16>;
type Cache = PrefixMem<16, 32, 16>;

const A: u64 = 0xa;
const B: u64 = 0xb;

fn r(slot: u16) -> KvRef {
    KvRef {
        slot,
        id: RequestId(slot as u64 + 100),
    }
}

/// The exact audit with scratch space for every page.
fn audited(p: &KvPool<'_>) -> bool {
    let mut scratch = [0u32; 16];
    p.audit(&mut scratch[..p.config().page_info_len()])
}

/// Hashes and prepares a first chunk of `prompt` tokens under `root`, and resizes it to the whole
/// prompt. Returns the reused tokens.
fn admit(p: &mut KvPool<'_>, slot: u16, root: u64, hashes: &[u64], prompt: u32) -> u32 {
    p.set_prefix(r(slot), root, hashes);
    let reused = p
        .prepare_context(r(slot), ContextPrep::first(prompt))
        .expect("a slot");
    assert!(
        p.resize_context(r(slot), prompt, true),
        "room for the prompt"
    );
    reused
}

/// [`admit`], then the whole prompt computed and committed.
fn computed(p: &mut KvPool<'_>, slot: u16, root: u64, hashes: &[u64], prompt: u32) -> u32 {
    let reused = admit(p, slot, root, hashes, prompt);
    p.commit(r(slot), prompt);
    reused
}

#[test]
fn a_second_request_shares_the_committed_full_blocks() {
    let (mut b, mut c) = (Buf::new(), Cache::new());
    let mut p = b.pool_with(0, 4, Some(&mut c));
    assert_eq!(computed(&mut p, 0, A, &[1, 2], 10), 0, "nothing cached yet");
    assert_eq!(p.gpu_free(), 5);
    assert_eq!(p.cached_pages(Tier::Gpu), 2, "the two full blocks");
    assert_eq!(admit(&mut p, 1, A, &[1, 2], 10), 8);
    assert_eq!(p.table(1)[..2], p.table(0)[..2], "the same pages");
    assert_ne!(p.table(1)[2], p.table(0)[2], "the partial block is private");
    assert_eq!(p.gpu_free(), 4, "one new page for the tail");
    assert_eq!(p.page_info(p.table(0)[0]).map(|i| i.refs()), Some(2));
    assert_eq!(p.prefix_stats().map(|s| s.gpu_hits), Some(2));
    assert!(audited(&p));
    p.free(r(0));
    assert_eq!(p.gpu_free(), 5, "only its private page is freed");
    p.free(r(1));
    assert_eq!(p.gpu_free(), 6, "the cached blocks stay matchable");
    assert!(audited(&p));
    assert_eq!(
        admit(&mut p, 2, A, &[1, 2], 10),
        8,
        "a finished prefix is found again"
    );
    assert!(audited(&p));
}

#[test]
fn reuse_stops_before_the_last_token_and_the_lookahead() {
    let (mut b, mut c) = (Buf::new(), Cache::new());
    let mut p = b.pool_with(0, 4, Some(&mut c));
    computed(&mut p, 0, A, &[1, 2, 3], 12);
    assert_eq!(p.cached_pages(Tier::Gpu), 3);
    p.set_prefix(r(1), A, &[1, 2, 3]);
    assert_eq!(
        p.prepare_context(r(1), ContextPrep::first(12)),
        Some(8),
        "the last token is computed"
    );
    p.free(r(1));
    p.set_prefix(r(1), A, &[1, 2, 3]);
    assert_eq!(p.prepare_context(r(1), ContextPrep::first(13)), Some(12));
    p.free(r(1));
    p.set_prefix(r(1), A, &[1, 2, 3]);
    let drafts = ContextPrep {
        lookahead: 4,
        ..ContextPrep::first(13)
    };
    assert_eq!(
        p.prepare_context(r(1), drafts),
        Some(8),
        "backed off by the lookahead"
    );
    p.free(r(1));
    assert!(audited(&p));
}

#[test]
fn another_root_matches_nothing() {
    let (mut b, mut c) = (Buf::new(), Cache::new());
    let mut p = b.pool_with(0, 4, Some(&mut c));
    computed(&mut p, 0, A, &[1, 2], 9);
    assert_eq!(
        computed(&mut p, 1, B, &[1, 2], 9),
        0,
        "same hashes, other adapter"
    );
    assert_eq!(p.cached_pages(Tier::Gpu), 4, "each root caches its own");
    assert!(p.table(0).iter().all(|e| !p.table(1).contains(e)));
    assert!(audited(&p));
}

#[test]
fn the_partial_last_block_is_never_cached() {
    let (mut b, mut c) = (Buf::new(), Cache::new());
    let mut p = b.pool_with(0, 4, Some(&mut c));
    // The engine hashed the partial third block too: it is never committed.
    computed(&mut p, 0, A, &[1, 2, 3], 10);
    assert_eq!(p.cached_pages(Tier::Gpu), 2);
    assert_eq!(p.seq(0).committed, 2);
    assert_eq!(
        admit(&mut p, 1, A, &[1, 2, 3], 14),
        8,
        "block 3 was never cached"
    );
    assert!(audited(&p));
}

#[test]
fn unreferenced_blocks_are_evicted_leaf_first_least_recent_first() {
    let (mut b, mut c) = (Buf::new(), Cache::new());
    let mut p = b.pool_with(0, 4, Some(&mut c));
    computed(&mut p, 0, A, &[1, 2], 8);
    p.free(r(0));
    computed(&mut p, 1, A, &[5, 6], 8);
    p.free(r(1));
    assert_eq!((p.gpu_free(), p.cached_pages(Tier::Gpu)), (4, 4));
    admit(&mut p, 2, B, &[], 16);
    assert_eq!(
        p.prefix_stats().map(|s| s.evicted),
        Some(0),
        "free pages first"
    );
    // Two pages more: the oldest leaf (block 2 of [1, 2]) goes, then its parent is a leaf but younger
    // than the leaf of [5, 6].
    admit(&mut p, 3, B, &[], 8);
    assert_eq!(p.prefix_stats().map(|s| s.evicted), Some(2));
    assert_eq!(p.cached_pages(Tier::Gpu), 2);
    p.set_prefix(r(0), A, &[1, 2]);
    assert_eq!(
        p.prepare_context(r(0), ContextPrep::first(9)),
        Some(4),
        "block 1 stayed"
    );
    p.free(r(0));
    p.set_prefix(r(1), A, &[5, 6]);
    assert_eq!(
        p.prepare_context(r(1), ContextPrep::first(9)),
        Some(4),
        "block 5 stayed"
    );
    p.free(r(1));
    assert!(audited(&p));
}

#[test]
fn a_referenced_block_is_never_evicted() {
    let (mut b, mut c) = (Buf::new(), Cache::new());
    let mut p = b.pool_with(0, 4, Some(&mut c));
    computed(&mut p, 0, A, &[1, 2, 3, 4], 16);
    assert_eq!(admit(&mut p, 1, A, &[1, 2, 3, 4], 16), 12);
    assert_eq!(p.gpu_free(), 3);
    p.set_prefix(r(2), B, &[]);
    assert_eq!(p.prepare_context(r(2), ContextPrep::first(16)), Some(0));
    assert!(
        !p.resize_context(r(2), 16, true),
        "4 pages, 3 free, none evictable"
    );
    p.free(r(2));
    assert_eq!(p.gpu_free(), 3);
    assert_eq!(p.cached_pages(Tier::Gpu), 4);
    assert!(p
        .table(0)
        .iter()
        .all(|&e| p.page_info(e).is_some_and(|i| i.refs() >= 1)));
    assert!(audited(&p));
}

#[test]
fn with_a_host_tier_evicted_blocks_are_demoted_and_a_match_reloads_them() {
    let (mut b, mut c) = (Buf::new(), Cache::new());
    let mut p = b.pool_with(8, 4, Some(&mut c));
    computed(&mut p, 0, A, &[1, 2], 8);
    p.free(r(0));
    admit(&mut p, 1, B, &[], 16);
    admit(&mut p, 2, B, &[], 16);
    let stats = p.prefix_stats().unwrap_or_default();
    assert_eq!((stats.demoted, stats.evicted), (2, 0));
    assert_eq!(p.cached_pages(Tier::Host), 2);
    let moves = p.take_moves();
    assert_eq!(moves.len(), 2);
    assert!(moves.iter().all(|m| m.from == Tier::Gpu));
    p.free(r(1));
    p.set_prefix(r(3), A, &[1, 2]);
    assert_eq!(
        p.prepare_context(r(3), ContextPrep::first(9)),
        Some(8),
        "reused, not recomputed"
    );
    assert_eq!(p.seq(3).state, SeqState::Claimed);
    assert!(
        p.take_moves().is_empty(),
        "claimed: nothing is copied before the resize"
    );
    assert!(audited(&p));
    assert!(p.resize_context(r(3), 9, true));
    assert_eq!(p.seq(3).state, SeqState::Active);
    let moves = p.take_moves();
    assert_eq!(moves.len(), 2);
    assert!(moves.iter().all(|m| m.from == Tier::Host));
    assert_eq!(p.prefix_stats().map(|s| s.host_hits), Some(2));
    assert_eq!(
        (p.cached_pages(Tier::Gpu), p.cached_pages(Tier::Host)),
        (2, 0)
    );
    assert_eq!(p.host_free(), 8);
    assert!(p.table(3).iter().all(|&e| page_of(e).0 == Tier::Gpu));
    assert!(audited(&p));
}

#[test]
fn a_refused_admission_copies_nothing_and_a_claim_is_one_rows() {
    let (mut b, mut c) = (Buf::new(), Cache::new());
    let mut p = b.pool_with(8, 4, Some(&mut c));
    computed(&mut p, 0, A, &[1, 2], 8);
    p.free(r(0));
    admit(&mut p, 1, B, &[], 16);
    admit(&mut p, 2, B, &[], 16);
    p.take_moves();
    assert_eq!(p.cached_pages(Tier::Host), 2);
    p.set_prefix(r(3), A, &[1, 2, 3, 4]);
    assert_eq!(
        p.prepare_context(r(3), ContextPrep::first(16)),
        Some(8),
        "both blocks claimed on the host"
    );
    p.set_prefix(r(0), A, &[1, 2]);
    assert_eq!(
        p.prepare_context(r(0), ContextPrep::first(9)),
        Some(0),
        "a claimed block is one row's"
    );
    p.free(r(0));
    assert!(
        !p.resize_context(r(3), 16, true),
        "no GPU page for the reloads"
    );
    p.free(r(3));
    assert!(
        p.take_moves().is_empty(),
        "the refused admission copied nothing"
    );
    assert_eq!(
        p.cached_pages(Tier::Host),
        2,
        "its claims are released, still cached"
    );
    assert!(audited(&p));
}

#[test]
fn a_block_computed_twice_is_kept_once() {
    let (mut b, mut c) = (Buf::new(), Cache::new());
    let mut p = b.pool_with(0, 4, Some(&mut c));
    assert_eq!(admit(&mut p, 0, A, &[1, 2], 10), 0);
    assert_eq!(
        admit(&mut p, 1, A, &[1, 2], 10),
        0,
        "admitted before anything was committed"
    );
    p.commit(r(0), 10);
    p.commit(r(1), 10);
    assert_eq!(p.prefix_stats().map(|s| s.deduplicated), Some(2));
    assert_eq!(p.table(1)[..2], p.table(0)[..2], "the second copy gave way");
    assert_eq!(p.gpu_free(), 4, "and its pages are free");
    assert!(audited(&p));
}

#[test]
fn suspension_moves_only_private_pages() {
    let (mut b, mut c) = (Buf::new(), Cache::new());
    let mut p = b.pool_with(8, 4, Some(&mut c));
    computed(&mut p, 0, A, &[1, 2], 8);
    assert_eq!(admit(&mut p, 1, A, &[1, 2], 12), 8);
    let shared = [p.table(1)[0], p.table(1)[1]];
    p.take_moves();
    p.suspend(r(1));
    assert_eq!(p.take_moves().len(), 1, "its one private page");
    assert_eq!(p.table(1)[..2], shared, "the shared pages stay on the GPU");
    assert_eq!(page_of(p.table(1)[2]).0, Tier::Host);
    assert!(audited(&p));
    assert!(p.try_allocate_generation(r(1), 1), "resumed and grown");
    assert_eq!(p.take_moves().len(), 1);
    assert_eq!(p.table(1).len(), 4);
    assert!(p.table(1).iter().all(|&e| page_of(e).0 == Tier::Gpu));
    assert_eq!(p.table(1)[..2], shared);
    assert!(audited(&p));
}

#[test]
fn a_host_cached_block_is_taken_over_by_a_fresh_copy() {
    let (mut b, mut c) = (Buf::new(), Cache::new());
    let mut p = b.pool_with(8, 4, Some(&mut c));
    admit(&mut p, 0, A, &[1, 2], 8);
    admit(&mut p, 1, A, &[1, 2], 8);
    p.commit(r(0), 8);
    p.free(r(0));
    admit(&mut p, 2, B, &[], 16);
    admit(&mut p, 3, B, &[], 8);
    assert_eq!(p.cached_pages(Tier::Host), 2, "demoted under pressure");
    p.commit(r(1), 8);
    assert_eq!(
        (p.cached_pages(Tier::Gpu), p.cached_pages(Tier::Host)),
        (2, 0)
    );
    assert_eq!(p.host_free(), 8, "the host copies are free");
    assert_eq!(p.prefix_stats().map(|s| s.deduplicated), Some(2));
    assert!(audited(&p));
}

#[test]
fn a_refused_first_chunk_keeps_no_claim() {
    let (mut b, mut c) = (Buf::new(), Cache::new());
    let mut p = b.pool_with(0, 4, Some(&mut c));
    computed(&mut p, 0, A, &[1, 2], 8);
    p.free(r(0));
    admit(&mut p, 2, B, &[], 16);
    admit(&mut p, 3, B, &[], 4);
    p.set_prefix(r(1), A, &[1, 2, 3, 4]);
    assert_eq!(p.prepare_context(r(1), ContextPrep::first(16)), Some(8));
    let page = p.table(1)[0];
    assert_eq!(p.page_info(page).map(|i| i.refs()), Some(1));
    assert!(
        !p.resize_context(r(1), 16, true),
        "2 pages more, 1 free, the idle blocks are its own"
    );
    p.free(r(1));
    assert_eq!(
        p.page_info(page).map(|i| i.refs()),
        Some(0),
        "the claim is gone"
    );
    assert_eq!(p.cached_pages(Tier::Gpu), 2, "the blocks stay cached");
    assert!(audited(&p));
}

#[test]
fn the_first_new_block_is_probed_without_side_effects() {
    let (mut b, mut c) = (Buf::new(), Cache::new());
    let mut p = b.pool_with(0, 4, Some(&mut c));
    computed(&mut p, 0, A, &[1, 2], 8);
    p.set_prefix(r(1), A, &[1, 2, 3]);
    let before = p.fingerprint();
    let third = chain(chain(chain(A, 1), 2), 3);
    assert_eq!(
        p.probe_first_new_block(r(1), ContextPrep::first(16)),
        Some(third)
    );
    p.set_prefix(r(2), B, &[1, 2, 3]);
    assert_eq!(
        p.probe_first_new_block(r(2), ContextPrep::first(16)),
        Some(chain(B, 1)),
        "another root starts from its first block"
    );
    let later = ContextPrep {
        first_chunk: false,
        prompt: 16,
        position: 4,
        lookahead: 0,
        reuse_limit: ContextPrep::NO_LIMIT,
    };
    assert_eq!(
        p.probe_first_new_block(r(1), later),
        Some(chain(chain(A, 1), 2))
    );
    p.set_prefix(r(3), A, &[]);
    assert_eq!(
        p.probe_first_new_block(r(3), ContextPrep::first(16)),
        None,
        "no hashes"
    );
    let before_probe = p.fingerprint();
    let _ = p.probe_first_new_block(r(1), ContextPrep::first(16));
    assert_eq!(p.fingerprint(), before_probe);
    assert_ne!(before, 0);
    assert!(p.all_blocks_reusable());
    assert!(audited(&p));
}

#[test]
fn without_a_prefix_cache_nothing_is_shared() {
    let mut b = Buf::new();
    let mut p = b.pool(0, 4);
    assert_eq!(computed(&mut p, 0, A, &[1, 2], 10), 0);
    assert_eq!(computed(&mut p, 1, A, &[1, 2], 10), 0);
    assert_eq!(p.cached_pages(Tier::Gpu), 0);
    assert!(
        p.prefix().is_none() && p.caps().prefix.is_none(),
        "no prefix capability"
    );
    assert_eq!(p.probe_first_new_block(r(1), ContextPrep::first(10)), None);
    let mut scratch = [0u32; 8];
    assert!(p.audit(&mut scratch));
}

#[test]
fn a_window_release_keeps_committed_blocks_cached_and_the_audit_holds() {
    let (mut b, mut c) = (Buf::new(), Cache::new());
    let mut p = b.pool_with(0, 4, Some(&mut c));
    computed(&mut p, 0, A, &[1, 2, 3], 14);
    assert_eq!((p.gpu_free(), p.cached_pages(Tier::Gpu)), (4, 3));
    p.release_window(r(0), 8);
    assert_eq!(p.seq(0).released, 2);
    assert_eq!(p.gpu_free(), 4, "committed blocks stay cached");
    assert_eq!(p.idle_pages(Tier::Gpu), 2, "idle: no row references them");
    assert!(audited(&p));
    // A later request sharing the prefix still finds every block.
    assert_eq!(admit(&mut p, 1, A, &[1, 2, 3], 14), 12);
    assert!(audited(&p));
    p.free(r(0));
    p.free(r(1));
    assert_eq!(p.gpu_free() + p.idle_pages(Tier::Gpu), 8);
    assert!(audited(&p));
}

#[test]
fn blocks_released_before_their_commit_are_skipped_by_it() {
    let (mut b, mut c) = (Buf::new(), Cache::new());
    let mut p = b.pool_with(0, 4, Some(&mut c));
    admit(&mut p, 0, A, &[1, 2, 3], 14);
    p.release_window(r(0), 8);
    assert_eq!(p.gpu_free(), 6, "uncommitted pages are freed");
    p.commit(r(0), 14);
    assert_eq!(
        p.cached_pages(Tier::Gpu),
        1,
        "only block 2 was there to commit"
    );
    assert_eq!(p.seq(0).committed, 3);
    assert_eq!(p.seq(0).chain, chain(chain(chain(A, 1), 2), 3));
    assert!(audited(&p));
}

/// vLLM's `reset_prefix_cache`: the idle cached blocks go (their pages free, nothing matched
/// after); a block a live request holds stays.
#[test]
fn dropping_the_idle_blocks_frees_them_and_keeps_the_held() {
    let (mut b, mut c) = (Buf::new(), Cache::new());
    let mut p = b.pool_with(0, 4, Some(&mut c));
    computed(&mut p, 0, A, &[1, 2], 10);
    computed(&mut p, 1, B, &[3], 4);
    p.free(r(0));
    assert_eq!(p.cached_pages(Tier::Gpu), 3);
    assert_eq!(p.drop_idle_blocks(), 2, "A's two blocks; B's is held");
    assert_eq!(p.cached_pages(Tier::Gpu), 1);
    assert_eq!(p.gpu_free(), 7);
    assert!(audited(&p));
    assert_eq!(admit(&mut p, 2, A, &[1, 2], 10), 0, "nothing of A is found");
    assert!(admit(&mut p, 3, B, &[3, 4], 9) > 0, "B's held block is");
    assert!(audited(&p));
}
