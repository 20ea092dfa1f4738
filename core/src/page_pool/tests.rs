//! The page pool's unit tests.
use super::*;
use crate::ids::RequestId;
use crate::kv::{ContextPrep, KvBackend, KvRef, PairedPool};

/// 8 GPU pages, up to 4 host pages, 4 slots of 4 pages, 4 tokens a page.
type Buf = crate::testing::Mem<8, 4, 4, 16, 12>;

/// The pool, with or without its host tier.
fn pool(b: &mut Buf, host: bool) -> KvPool<'_> {
    b.pool(if host { 4 } else { 0 }, 4)
}

fn r(slot: u16) -> KvRef {
    KvRef {
        slot,
        id: RequestId(slot as u64 + 100),
    }
}
const FIRST: ContextPrep = ContextPrep::first(8);

#[test]
fn grow_suspend_to_host_and_resume_moves_every_page() {
    let mut b = Buf::new();
    let mut p = pool(&mut b, true);
    assert_eq!(p.prepare_context(r(0), FIRST), Some(0));
    assert!(p.resize_context(r(0), 8, true));
    assert_eq!(p.gpu_free(), 6);
    p.suspend(r(0));
    assert!(!p.cache(r(0)).is_active());
    assert_eq!((p.gpu_free(), p.host_free()), (8, 2));
    let out: heapless::Vec<PageMove, 8> = p.take_moves().iter().copied().collect();
    assert_eq!(out.len(), 2);
    assert!(out.iter().all(|m| m.from == Tier::Gpu));
    assert!(p.try_allocate_generation(r(0), 1));
    assert_eq!(p.seq(0).capacity, 9);
    assert_eq!(p.gpu_free(), 5, "two pages back plus one for the growth");
    assert_eq!(p.take_moves().len(), 2);
    assert!(p.check());
    p.revert_allocate_generation(r(0));
    assert_eq!(p.gpu_free(), 6);
    p.free(r(0));
    assert_eq!((p.gpu_free(), p.host_free()), (8, 4));
    assert!(p.check());
}

#[test]
fn suspension_without_a_host_tier_holds_the_pages() {
    let mut b = Buf::new();
    let mut p = pool(&mut b, false);
    p.prepare_context(r(1), FIRST).unwrap();
    assert!(p.resize_context(r(1), 16, true));
    p.suspend(r(1));
    assert_eq!(p.gpu_free(), 4, "held pages are not freed");
    assert_eq!(p.stats().held_suspends, 1);
    assert!(p.try_allocate_generation(r(1), 0));
    assert!(p.check());
}

#[test]
fn exhaustion_is_all_or_nothing() {
    let mut b = Buf::new();
    let mut p = pool(&mut b, false);
    p.prepare_context(r(0), FIRST).unwrap();
    assert!(p.resize_context(r(0), 16, true));
    p.prepare_context(r(1), FIRST).unwrap();
    assert!(p.resize_context(r(1), 12, true));
    assert_eq!(p.gpu_free(), 1);
    p.prepare_context(r(2), FIRST).unwrap();
    assert!(!p.resize_context(r(2), 8, true), "needs 2 pages, 1 free");
    assert_eq!(p.gpu_free(), 1, "refusal took nothing");
    assert!(
        !p.try_allocate_generation(r(0), 1),
        "table is at max_blocks"
    );
    assert_eq!(p.seq(0).capacity, 16);
    assert!(!p.try_allocate_generation(r(3), 1), "no cache");
    assert!(p.check());
}

/// Spec §5 AC01-AC03, the manager's resume preview: no cache is not blocked; an active cache is not
/// blocked; a suspended one is blocked only while its resume would be refused.
#[test]
fn the_resume_preview_blocks_only_a_suspended_cache_that_cannot_come_back() {
    let mut b = Buf::new();
    let mut p = pool(&mut b, true);
    assert!(!p.resume_blocked(r(0)), "no cache");
    p.prepare_context(r(0), FIRST).unwrap();
    assert!(p.resize_context(r(0), 16, true));
    assert!(!p.resume_blocked(r(0)), "active");
    p.suspend(r(0));
    assert!(
        !p.resume_blocked(r(0)),
        "suspended, and the GPU has room to take it back"
    );
    p.prepare_context(r(1), FIRST).unwrap();
    assert!(p.resize_context(r(1), 16, true));
    p.prepare_context(r(2), FIRST).unwrap();
    assert!(p.resize_context(r(2), 12, true));
    assert!(
        p.resume_blocked(r(0)),
        "suspended, 4 pages to bring back, 1 free"
    );
    p.free(r(2));
    assert!(!p.resume_blocked(r(0)), "the gate opens");
    assert!(p.check());
}

#[test]
fn a_window_release_frees_the_leading_pages_and_the_rest_moves_as_usual() {
    let mut b = Buf::new();
    let mut p = pool(&mut b, true);
    p.prepare_context(r(0), FIRST).unwrap();
    assert!(p.resize_context(r(0), 16, true));
    assert_eq!(p.gpu_free(), 4);
    let fp = p.fingerprint();
    p.release_window(r(0), 7);
    assert_eq!(
        p.seq(0).released,
        1,
        "only block 0 lies wholly before position 7"
    );
    p.release_window(r(0), 4);
    assert_eq!(p.seq(0).released, 1, "a window never takes a block back");
    assert_ne!(p.fingerprint(), fp);
    p.release_window(r(0), 9);
    assert_eq!(p.seq(0).released, 2);
    assert_eq!(p.gpu_free(), 6, "two pages back");
    assert_eq!(&p.table(0)[..2], &[NO_PAGE, NO_PAGE]);
    assert!(p.check());
    // Suspension moves only the pages the row still has; resumption brings them back.
    p.suspend(r(0));
    assert_eq!(p.take_moves().len(), 2);
    assert_eq!((p.gpu_free(), p.host_free()), (8, 2));
    assert!(p.check());
    assert!(p.try_allocate_generation(r(0), 0));
    assert_eq!(p.take_moves().len(), 2);
    assert_eq!(&p.table(0)[..2], &[NO_PAGE, NO_PAGE]);
    assert!(p.check());
    p.free(r(0));
    assert_eq!((p.gpu_free(), p.host_free()), (8, 4));
    assert_eq!(p.seq(0).released, 0);
    assert!(p.check());
}

#[test]
fn a_window_release_of_an_inactive_row_changes_nothing() {
    let mut b = Buf::new();
    let mut p = pool(&mut b, false);
    p.prepare_context(r(1), FIRST).unwrap();
    assert!(p.resize_context(r(1), 16, true));
    p.suspend(r(1));
    let fp = p.fingerprint();
    p.release_window(r(1), 16);
    p.release_window(r(3), 16);
    assert_eq!(p.fingerprint(), fp);
}
