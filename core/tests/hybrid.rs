//! A hybrid recurrent model's backend (`kv_groups::Hybrid`): one state slot a request beside its
//! attention groups, all or nothing; suspension, resumption, recompute pause and `free` move or drop
//! it with the pages; prefix reuse resumes from a snapshot. The peers' bugs each have a test named
//! after the behaviour (vLLM PR #45845, vLLM #29387, SGLang #16067, SGLang #36770, SGLang #37836,
//! vLLM #40696).

mod support;

use kvsched_core::kv::{ContextPrep, KvBackend, PrefixReuse, Tier};
use kvsched_core::state_pool::{Placement, StateConfig, StateOp};
use kvsched_core::{Error, RequestId};
use support::hybrid::{hashes, hybrid, r, state, TPB};
use support::prefill;

#[test]
fn bad_state_configurations_are_refused() {
    let ok = state(4, 4, 1, 32);
    for (cfg, why) in [
        (
            StateConfig {
                slot_bytes: 0,
                ..ok
            },
            "one byte",
        ),
        (StateConfig { gpu_slots: 0, ..ok }, "one GPU slot"),
        (
            StateConfig {
                snapshot_slots: 4,
                ..ok
            },
            "live request",
        ),
        (
            StateConfig {
                snapshot_interval: 24,
                ..ok
            },
            "whole number",
        ),
        (
            StateConfig {
                snapshot_interval: 0,
                ..ok
            },
            "whole number",
        ),
        (
            StateConfig {
                gpu_slots: 2,
                host_slots: 2,
                ..ok
            },
            "ever hold",
        ),
        (
            StateConfig {
                gpu_slots: 99,
                ..ok
            },
            "capacity",
        ),
    ] {
        match support::hybrid::try_hybrid(64, 0, cfg) {
            Err(Error::Invalid(m)) => assert!(m.contains(why), "{m:?} for {why}"),
            other => panic!("{why}: {other:?}"),
        }
    }
}

#[test]
fn a_request_holds_one_state_slot_whatever_its_length() {
    let mut k = hybrid(64, 0, state(8, 0, 0, 32));
    prefill(&mut k, 0, 1, &hashes(1, 20, 0, 20), 320, 64);
    for _ in 0..40 {
        assert!(k.try_allocate_generation(r(0), 1));
    }
    assert_eq!(k.state().gpu_free(), 7);
    assert!(matches!(k.state().placement(0), Placement::Gpu(_)));
    k.free(r(0));
    assert_eq!(k.state().gpu_free(), 8);
    assert!(k.check());
}

#[test]
fn suspension_moves_the_state_to_the_host_and_resumption_brings_it_back() {
    let mut k = hybrid(64, 64, state(2, 2, 0, 32));
    prefill(&mut k, 0, 1, &hashes(1, 4, 0, 4), 64, 64);
    let Placement::Gpu(g) = k.state().placement(0) else {
        panic!("live")
    };
    k.suspend(r(0));
    let m = k.take_state_moves().to_vec();
    assert_eq!(m.len(), 1);
    assert_eq!((m[0].op, m[0].src), (StateOp::Move(Tier::Gpu), g));
    assert_eq!(k.state().placement(0), Placement::Host(m[0].dst));
    assert!(k.check());
    assert!(k.try_allocate_generation(r(0), 1));
    let back = k.take_state_moves().to_vec();
    assert_eq!(
        (back[0].op, back[0].src),
        (StateOp::Move(Tier::Host), m[0].dst)
    );
    assert!(matches!(k.state().placement(0), Placement::Gpu(_)));
    // A recompute pause drops it.
    k.preempt(r(0));
    assert_eq!(k.state().placement(0), Placement::None);
    assert_eq!(k.state().gpu_free(), 2);
    assert!(k.check());
}

#[test]
fn a_suspended_state_without_host_room_is_held_on_the_gpu() {
    let mut k = hybrid(64, 64, state(8, 0, 0, 32));
    prefill(&mut k, 0, 1, &hashes(1, 4, 0, 4), 64, 64);
    k.suspend(r(0));
    assert!(matches!(k.state().placement(0), Placement::Held(_)));
    assert!(k.take_state_moves().is_empty());
    assert!(k.try_allocate_generation(r(0), 1));
    assert!(k.take_state_moves().is_empty(), "resumed where it was held");
    assert!(k.check());
}

#[test]
fn a_request_without_a_state_slot_is_refused_and_nothing_is_prepared() {
    // SGLang #36770: no state slot evictable is a refusal, never a crash.
    let mut k = hybrid(64, 0, state(2, 0, 0, 32));
    prefill(&mut k, 0, 1, &hashes(1, 2, 0, 2), 32, 64);
    prefill(&mut k, 1, 1, &hashes(2, 2, 0, 2), 32, 64);
    let pages = k.attention().groups()[0].pool.gpu_free();
    k.set_prefix(r(2), 1, &hashes(3, 2, 0, 2));
    assert_eq!(k.prepare_context(r(2), ContextPrep::first(32)), None);
    assert!(!k.cache(r(2)).exists());
    assert_eq!(k.attention().groups()[0].pool.gpu_free(), pages);
    assert!(!k.prepare_disagg_gen_init(r(2), 32));
    k.free(r(0));
    assert_eq!(k.prepare_context(r(2), ContextPrep::first(32)), Some(0));
    assert!(k.check());
}

#[test]
fn a_refused_admission_leaks_no_state_slot() {
    // SGLang #16067: a first chunk refused its pages before anything was written gives its state
    // slot back at once (it holds nothing worth a copy) and takes a fresh one on its next attempt.
    let mut k = hybrid(4, 0, state(8, 0, 0, 32));
    k.set_prefix(r(0), 1, &hashes(1, 8, 0, 8));
    assert_eq!(k.prepare_context(r(0), ContextPrep::first(128)), Some(0));
    assert!(!k.resize_context(r(0), 128, true), "8 pages on a pool of 4");
    assert!(!k.cache(r(0)).is_active());
    assert_eq!(k.state().placement(0), Placement::None);
    assert_eq!(k.state().gpu_free(), 8);
    assert!(k.take_state_moves().is_empty(), "nothing copied");
    assert!(k.check());
    assert_eq!(k.prepare_context(r(0), ContextPrep::first(128)), Some(0));
    assert!(matches!(k.state().placement(0), Placement::Gpu(_)));
    assert!(k.check());
    k.free(r(0));
    assert_eq!(k.state().gpu_free(), 8);
    assert!(k.check());
}

#[test]
fn a_refused_admission_after_a_hit_withdraws_its_restore() {
    // A first chunk that reused a prefix holds nothing but the snapshot's copy: refused its pages,
    // it gives its state up and its restore is withdrawn (no copy to the host: the pass frees such
    // a chunk); resumed instead, it restores from the snapshot again.
    let mut k = hybrid(9, 8, state(4, 4, 2, 32));
    let h = hashes(1, 6, 0, 6);
    prefill(&mut k, 0, 7, &h, 100, 64);
    k.free(r(0));
    let _ = k.take_state_moves();
    let mut longer = h.clone();
    longer.extend(hashes(2, 0, 3, 6));
    k.set_prefix(r(1), 7, &longer);
    assert_eq!(k.prepare_context(r(1), ContextPrep::first(190)), Some(96));
    assert!(
        !k.resize_context(r(1), 190, true),
        "12 pages on a pool of 9"
    );
    assert_eq!(k.state().placement(1), Placement::None);
    assert!(
        k.take_state_moves().is_empty(),
        "the restore withdrawn, nothing offloaded"
    );
    assert!(k.check());
    let later = ContextPrep {
        first_chunk: false,
        position: 96,
        ..ContextPrep::first(190)
    };
    assert_eq!(k.prepare_context(r(1), later), Some(0));
    let ops: Vec<StateOp> = k.take_state_moves().iter().map(|m| m.op).collect();
    assert_eq!(ops, [StateOp::Restore]);
    assert!(k.check());
    k.free(r(1));
    assert!(k.check());
}

#[test]
fn a_prefix_hit_resumes_from_the_snapshot_at_the_deepest_point() {
    let mut k = hybrid(64, 0, state(8, 0, 4, 32));
    let h = hashes(1, 12, 0, 12);
    // 200 tokens: 12 full blocks; snapshot points every 32 tokens: the deepest is 192.
    prefill(&mut k, 0, 7, &h, 200, 64);
    let caps = k.take_captures().to_vec();
    assert_eq!(
        caps.iter().map(|c| c.position).collect::<Vec<_>>(),
        [64, 128, 192]
    );
    k.free(r(0));
    let reused = prefill(&mut k, 1, 7, &h, 230, 64);
    assert_eq!(reused, 192);
    let m = k.take_state_moves().to_vec();
    let restore = m
        .iter()
        .find(|m| m.op == StateOp::Restore)
        .expect("restored");
    assert_eq!(k.state().snapshot_position(restore.src), Some(192));
    assert_eq!(k.state().stats().hits, 1);
    assert!(k.check());
}

#[test]
fn a_hit_without_a_snapshot_is_no_hit() {
    // No snapshot slots: the attention blocks are cached, but the recurrent layers would have to
    // scan the prefix again, so nothing is reused.
    let mut k = hybrid(64, 0, state(8, 0, 0, 32));
    let h = hashes(1, 12, 0, 12);
    prefill(&mut k, 0, 7, &h, 200, 64);
    k.free(r(0));
    k.set_prefix(r(1), 7, &h);
    assert_eq!(
        k.probe_context_reuse(r(1), ContextPrep::first(230)),
        Some(0)
    );
    assert_eq!(k.prepare_context(r(1), ContextPrep::first(230)), Some(0));
}

#[test]
fn a_snapshot_written_in_this_step_is_not_a_hit() {
    // vLLM #29387: a pending snapshot (its step not committed) cannot be read.
    let mut k = hybrid(64, 0, state(8, 0, 4, 32));
    let h = hashes(1, 8, 0, 8);
    k.set_prefix(r(0), 7, &h);
    assert_eq!(k.prepare_context(r(0), ContextPrep::first(140)), Some(0));
    assert!(k.resize_context(r(0), 140, true));
    assert_eq!(
        k.take_captures().len(),
        1,
        "the deepest point, 128, is pending"
    );
    k.set_prefix(r(1), 7, &h);
    assert_eq!(k.prepare_context(r(1), ContextPrep::first(140)), Some(0));
    k.commit(r(0), 140);
    k.set_prefix(r(2), 7, &h);
    assert_eq!(k.prepare_context(r(2), ContextPrep::first(140)), Some(128));
    assert!(k.check());
}

#[test]
fn a_chunk_that_runs_shorter_than_planned_drops_its_later_snapshot() {
    let mut k = hybrid(64, 0, state(8, 0, 4, 32));
    let h = hashes(1, 8, 0, 8);
    k.set_prefix(r(0), 7, &h);
    assert_eq!(k.prepare_context(r(0), ContextPrep::first(140)), Some(0));
    assert!(k.resize_context(r(0), 140, true));
    k.commit(r(0), 100);
    assert_eq!(k.state().snapshots(), 0, "128 was not scanned");
    assert!(k.check());
}

#[test]
fn a_snapshot_is_stored_at_the_block_that_ends_at_its_position() {
    // SGLang #37836: a shared prefix's snapshot is keyed by the block ending where it was taken, so a
    // hit resumes from exactly that point.
    let mut k = hybrid(128, 0, state(8, 0, 4, 32));
    // A and B share 5 blocks (80 tokens); C shares them too.
    prefill(&mut k, 0, 7, &hashes(1, 5, 10, 12), 200, 256);
    k.free(r(0));
    let _ = k.take_captures();
    // B's attention matches 80 tokens, but A kept a snapshot only at 192: B reuses nothing and takes
    // one at the shared point, 64 (the deepest snapshot point of its 80-token match).
    assert_eq!(prefill(&mut k, 1, 7, &hashes(1, 5, 11, 12), 200, 256), 0);
    let caps = k.take_captures().to_vec();
    assert_eq!(
        caps.iter().map(|c| c.position).collect::<Vec<_>>(),
        [192, 64]
    );
    k.free(r(1));
    assert_eq!(prefill(&mut k, 2, 7, &hashes(1, 5, 12, 12), 200, 256), 64);
    let m = k.take_state_moves().to_vec();
    assert_eq!(k.state().snapshot_position(m[0].src), Some(64));
    assert!(k.check());
}

#[test]
fn a_prompt_a_few_blocks_long_hits() {
    // vLLM #40696: snapshot points are on the attention block grid, not on a larger block the
    // hybrid layout forces: a 3-block prompt's follow-up resumes at 48 tokens.
    let mut k = hybrid(64, 0, state(8, 0, 4, TPB));
    let h = hashes(1, 3, 0, 3);
    prefill(&mut k, 0, 7, &h, 49, 64);
    k.free(r(0));
    let mut longer = h.clone();
    longer.extend(hashes(2, 0, 5, 2));
    assert_eq!(prefill(&mut k, 1, 7, &longer, 90, 64), 48);
}

#[test]
fn snapshots_never_crowd_out_live_requests_or_attention_blocks() {
    // vLLM PR #45845: snapshots stay within their bound, a live request evicts a ready one, and the
    // attention groups' cached blocks are untouched.
    let mut k = hybrid(256, 0, state(4, 0, 3, 32));
    for (s, fam) in [(0u16, 1u64), (1, 2), (2, 3), (3, 4)] {
        prefill(&mut k, s, 7, &hashes(fam, 4, 0, 4), 70, 64);
        k.free(r(s));
        assert!(k.state().snapshots() <= 3);
    }
    assert_eq!(k.state().snapshots(), 3);
    let pages = k.attention().groups()[0].pool.gpu_free();
    for s in 0..4u16 {
        let fresh = hashes(10 + u64::from(s), 0, 9, 2);
        k.set_prefix(r(s), 7, &fresh);
        assert_eq!(k.prepare_context(r(s), ContextPrep::first(20)), Some(0));
    }
    assert_eq!(
        k.state().snapshots(),
        0,
        "four live requests took every slot"
    );
    assert_eq!(k.attention().groups()[0].pool.gpu_free(), pages);
    assert!(k.check());
}

#[test]
fn a_window_group_beside_the_state_reuses_the_same_hit() {
    let mut k = support::hybrid::windowed(64, 64, state(8, 0, 4, 32));
    let h = hashes(1, 12, 0, 12);
    prefill(&mut k, 0, 7, &h, 200, 64);
    k.free(r(0));
    assert_eq!(prefill(&mut k, 1, 7, &h, 230, 64), 192);
    assert!(k.check());
}

#[test]
fn state_moves_name_the_request() {
    let mut k = hybrid(64, 64, state(2, 2, 0, 32));
    prefill(&mut k, 3, 1, &hashes(1, 2, 0, 2), 32, 64);
    k.suspend(r(3));
    assert_eq!(k.take_state_moves()[0].request, RequestId(13));
}

#[test]
fn a_hit_takes_its_snapshots_slot_over_when_no_other_is_free() {
    // Two GPU slots: one live request, its snapshot at 192 in the other. A second request with the
    // same prompt resumes there in the snapshot's own slot (its state is already in place: no copy).
    let mut k = hybrid(64, 0, state(2, 6, 1, 64));
    let h = hashes(1, 12, 0, 12);
    prefill(&mut k, 0, 7, &h, 200, 256);
    let snap = k.take_captures()[0].slot;
    assert_eq!(k.state().gpu_free(), 0);
    let _ = k.take_state_moves();
    assert_eq!(prefill(&mut k, 1, 7, &h, 200, 256), 192);
    assert_eq!(k.state().placement(1), Placement::Gpu(snap));
    assert!(k.take_state_moves().is_empty(), "no copy");
    assert_eq!((k.state().snapshots(), k.state().stats().hits), (0, 1));
    assert!(k.check());
}
