//! The C ABI's refusals, from Rust: every bad call returns its code and a message, and changes nothing.

use kvsched_capi::*;

#[path = "support/calls.rs"]
mod calls;
use calls::{last_error, request};

#[test]
fn bad_calls_are_refused_with_a_code_and_a_message_and_change_nothing() {
    // SAFETY: every pointer comes from `kvsched_engine_new` or a local, as the header requires.
    unsafe {
        let mut e: *mut Engine = std::ptr::null_mut();
        assert_eq!(
            kvsched_engine_new(std::ptr::null(), &raw mut e),
            KvschedStatus::NullPointer
        );
        let mut c = kvsched_config_default();
        c.max_requests = KVSCHED_MAX_REQUESTS + 1;
        assert_eq!(
            kvsched_engine_new(&raw const c, &raw mut e),
            KvschedStatus::Invalid
        );
        assert!(e.is_null() && last_error().contains("max_requests"));
        c = kvsched_config_default();
        c.gpu_pages = 0;
        assert_eq!(
            kvsched_engine_new(&raw const c, &raw mut e),
            KvschedStatus::Invalid
        );
        c = kvsched_config_default();
        c.max_blocks_per_request = 4;
        assert_eq!(
            kvsched_engine_new(&raw const c, &raw mut e),
            KvschedStatus::Ok
        );

        // Too large for a page table of 4 pages of 32 tokens.
        assert_eq!(
            kvsched_submit(e, &request(1, 500), std::ptr::null(), 0),
            KvschedStatus::TooLarge
        );
        assert!(last_error().contains("508 KV tokens"), "{}", last_error());
        // The message names the limit (in pages and tokens) and the field that raises it.
        for part in [
            "at most 128",
            "max_blocks_per_request = 4 pages of 32 tokens",
            "raise max_blocks_per_request",
        ] {
            assert!(last_error().contains(part), "{part}: {}", last_error());
        }
        assert_eq!(kvsched_len(e), 0);
        // Hashes claimed but not given.
        assert_eq!(
            kvsched_submit(e, &request(1, 64), std::ptr::null(), 2),
            KvschedStatus::NullPointer
        );
        // More block hashes than the prompt's full pages (64 tokens: 2 pages of 32).
        let hashes = [1u64, 2, 3];
        assert_eq!(
            kvsched_submit(e, &request(1, 64), hashes.as_ptr(), 3),
            KvschedStatus::Invalid
        );
        assert!(last_error().contains("full pages"), "{}", last_error());
        assert_eq!(kvsched_len(e), 0);
        // An adapter nobody registered.
        let mut lora = request(2, 64);
        lora.has_lora = 1;
        lora.lora_task = 7;
        assert_eq!(
            kvsched_submit(e, &raw const lora, std::ptr::null(), 0),
            KvschedStatus::Adapter
        );
        // A kind that does not exist.
        let mut odd = request(3, 64);
        odd.kind = 9;
        assert_eq!(
            kvsched_submit(e, &raw const odd, std::ptr::null(), 0),
            KvschedStatus::Invalid
        );
        assert_eq!(kvsched_len(e), 0);

        assert_eq!(
            kvsched_submit(e, &request(1, 64), std::ptr::null(), 0),
            KvschedStatus::Ok
        );
        assert_eq!(
            kvsched_submit(e, &request(1, 64), std::ptr::null(), 0),
            KvschedStatus::UnknownRequest
        );
        // No transfer to end on a plain request.
        assert_eq!(kvsched_end_send(e, 1, 1), KvschedStatus::Invalid);
        assert_eq!(kvsched_end_receive(e, 1, 1), KvschedStatus::Invalid);
        // A step completed before any pass.
        assert_eq!(kvsched_complete_step(e), KvschedStatus::StaleOutput);
        let mut out = std::mem::zeroed::<KvschedOutput>();
        assert_eq!(kvsched_schedule(e, &raw mut out), KvschedStatus::Ok);
        assert_eq!(out.n_context, 1);
        let entry = *out.context;
        assert_eq!((entry.id, entry.tokens, entry.last), (1, 64, 1));
        assert_eq!(
            kvsched_schedule(e, std::ptr::null_mut()),
            KvschedStatus::NullPointer
        );
        let (mut pages, mut n) = (std::ptr::null(), 0usize);
        assert_eq!(
            kvsched_page_table(e, 1, &raw mut pages, &raw mut n),
            KvschedStatus::Ok
        );
        assert_eq!(n, 2, "64 prompt tokens in 32-token pages");
        assert_eq!(
            kvsched_page_table(e, 5, &raw mut pages, &raw mut n),
            KvschedStatus::UnknownRequest
        );
        assert!(
            last_error().contains("request id 5 names no live request"),
            "{}",
            last_error()
        );
        assert_eq!(kvsched_complete_step(e), KvschedStatus::Ok);
        assert_eq!(kvsched_finish(e, 1), KvschedStatus::Ok);
        assert_eq!(kvsched_gpu_free(e), kvsched_config_default().gpu_pages);
        // Finishing it again, or an id never submitted: refused, and the message names the id.
        for id in [1, 77] {
            assert_eq!(kvsched_finish(e, id), KvschedStatus::UnknownRequest);
            assert!(
                last_error().contains(&format!("request id {id} names no live request")),
                "{}",
                last_error()
            );
        }
        assert_eq!(kvsched_len(e), 0);
        // A call that succeeds leaves the message as it was (kvsched_last_error's documented lifetime).
        assert_eq!(kvsched_schedule(e, &raw mut out), KvschedStatus::Ok);
        assert!(
            last_error().contains("request id 77 names no live request"),
            "{}",
            last_error()
        );
        kvsched_engine_free(e);
        kvsched_engine_free(std::ptr::null_mut());
        assert_eq!(
            kvsched_finish(std::ptr::null_mut(), 1),
            KvschedStatus::NullPointer
        );
    }
}

#[test]
fn an_engine_is_built_and_driven_on_a_small_stack() {
    // A thread of 256 KiB: the engine's tables (400 KiB, more in a debug build) are built on the heap,
    // in place, never on this stack.
    std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(|| {
            let config = KvschedConfig {
                max_requests: 1024,
                ..kvsched_config_default()
            };
            let mut engine = std::ptr::null_mut();
            // SAFETY: valid pointers; the engine is freed once, below.
            unsafe {
                assert_eq!(
                    kvsched_engine_new(&raw const config, &raw mut engine),
                    KvschedStatus::Ok
                );
                assert_eq!(
                    kvsched_submit(engine, &request(1, 64), std::ptr::null(), 0),
                    KvschedStatus::Ok
                );
                let mut out = std::mem::zeroed();
                assert_eq!(kvsched_schedule(engine, &raw mut out), KvschedStatus::Ok);
                assert_eq!(out.n_context, 1);
                kvsched_engine_free(engine);
            }
        })
        .expect("spawn")
        .join()
        .expect("no stack overflow, no panic");
}

#[test]
fn a_full_request_table_refuses_the_next_submit_and_changes_nothing() {
    // A first random run of the Python module found an engine of 4 requests taking 8 (the scheduler's
    // table is KVSCHED_MAX_REQUESTS long, the pool has 4 rows): 4 to 7 were never scheduled, and the
    // page table of one of them read past the pool's rows (a panic). The core now refuses a request
    // beyond its KV backend's slots (KvLimits::slots); this holds the C ABI to it.
    let config = KvschedConfig {
        max_requests: 4,
        ..kvsched_config_default()
    };
    let mut e = std::ptr::null_mut();
    // SAFETY: every pointer comes from `kvsched_engine_new` or a local; the engine is freed once.
    unsafe {
        assert_eq!(
            kvsched_engine_new(&raw const config, &raw mut e),
            KvschedStatus::Ok
        );
        for id in 0..4 {
            assert_eq!(
                kvsched_submit(e, &request(id, 64), std::ptr::null(), 0),
                KvschedStatus::Ok
            );
        }
        let before = (*e).fingerprint();
        assert_eq!(
            kvsched_submit(e, &request(4, 64), std::ptr::null(), 0),
            KvschedStatus::Capacity
        );
        assert!(
            last_error().contains("request table is full (capacity 4)"),
            "{}",
            last_error()
        );
        assert_eq!(
            (*e).fingerprint(),
            before,
            "the refused submit changed nothing"
        );
        assert_eq!(kvsched_len(e), 4);
        let (mut pages, mut n) = (std::ptr::null(), 0usize);
        assert_eq!(
            kvsched_page_table(e, 4, &raw mut pages, &raw mut n),
            KvschedStatus::UnknownRequest
        );
        // Every admitted request is scheduled; once one finishes, its row takes the next.
        let mut out = std::mem::zeroed::<KvschedOutput>();
        assert_eq!(kvsched_schedule(e, &raw mut out), KvschedStatus::Ok);
        assert_eq!(out.n_context, 4);
        assert_eq!(kvsched_complete_step(e), KvschedStatus::Ok);
        assert_eq!(kvsched_finish(e, 0), KvschedStatus::Ok);
        assert_eq!(
            kvsched_submit(e, &request(4, 64), std::ptr::null(), 0),
            KvschedStatus::Ok
        );
        assert_eq!(kvsched_schedule(e, &raw mut out), KvschedStatus::Ok);
        let context = std::slice::from_raw_parts(out.context, out.n_context);
        assert_eq!(context.iter().map(|c| c.id).collect::<Vec<_>>(), [4]);
        assert_eq!(
            kvsched_page_table(e, 4, &raw mut pages, &raw mut n),
            KvschedStatus::Ok
        );
        assert_eq!(n, 2);
        kvsched_engine_free(e);
    }
}

/// Issue 30 through the C ABI: the batch delta follows the batch (entered as context, changed as the
/// chunk completes, left with the id of a request already finished), it is empty over incremental
/// passes, and an incremental pass hands back the same arrays, unchanged (nothing copied).
#[test]
fn the_batch_delta_follows_the_batch_and_incremental_passes_copy_nothing() {
    let config = KvschedConfig {
        max_requests: 8,
        ..kvsched_config_default()
    };
    let mut e = std::ptr::null_mut();
    let ids = |d: *const KvschedEntry, n: usize| -> Vec<u64> {
        // SAFETY: the delta's arrays, valid until the next call that changes the engine.
        unsafe { std::slice::from_raw_parts(d, n) }
            .iter()
            .map(|x| x.id)
            .collect()
    };
    // SAFETY: every pointer comes from `kvsched_engine_new` or a local; the engine is freed once.
    unsafe {
        assert_eq!(
            kvsched_engine_new(&raw const config, &raw mut e),
            KvschedStatus::Ok
        );
        let mut delta = std::mem::zeroed::<KvschedDelta>();
        assert_eq!(
            kvsched_take_delta(e, &raw mut delta),
            KvschedStatus::StaleOutput,
            "no pass yet"
        );
        for id in 1..=3 {
            assert_eq!(
                kvsched_submit(e, &request(id, 40), std::ptr::null(), 0),
                KvschedStatus::Ok
            );
        }
        let mut out = std::mem::zeroed::<KvschedOutput>();
        assert_eq!(kvsched_schedule(e, &raw mut out), KvschedStatus::Ok);
        assert_eq!(kvsched_take_delta(e, &raw mut delta), KvschedStatus::Ok);
        assert_eq!(ids(delta.entered, delta.n_entered), [1, 2, 3]);
        assert_eq!((delta.n_left, delta.n_changed), (0, 0));
        let entered = std::slice::from_raw_parts(delta.entered, delta.n_entered);
        assert_eq!(entered[0].tokens, 40, "a context entry has its chunk");
        // The prompts are done: the three decode now (another list: changed).
        assert_eq!(kvsched_complete_step(e), KvschedStatus::Ok);
        assert_eq!(kvsched_schedule(e, &raw mut out), KvschedStatus::Ok);
        assert_eq!(out.n_generation, 3);
        assert_eq!(kvsched_take_delta(e, &raw mut delta), KvschedStatus::Ok);
        assert_eq!(ids(delta.changed, delta.n_changed), [1, 2, 3]);
        // Steady decode: the next passes are incremental, keep the arrays, and change nothing.
        assert_eq!(kvsched_complete_step(e), KvschedStatus::Ok);
        assert_eq!(kvsched_schedule(e, &raw mut out), KvschedStatus::Ok);
        let (first, copied) = (out.generation, ids(out.generation, out.n_generation));
        for _ in 0..5 {
            assert_eq!(kvsched_complete_step(e), KvschedStatus::Ok);
            assert_eq!(kvsched_schedule(e, &raw mut out), KvschedStatus::Ok);
            assert_eq!(out.generation, first, "the same array");
            assert_eq!(ids(out.generation, out.n_generation), copied);
            assert_eq!(kvsched_take_delta(e, &raw mut delta), KvschedStatus::Ok);
            assert_eq!(delta.n_entered + delta.n_left + delta.n_changed, 0);
        }
        assert!((*e).replayed_passes() >= 5, "the passes were incremental");
        // A request finished: it left, named by its id though it is gone.
        assert_eq!(kvsched_complete_step(e), KvschedStatus::Ok);
        assert_eq!(kvsched_finish(e, 2), KvschedStatus::Ok);
        assert_eq!(kvsched_schedule(e, &raw mut out), KvschedStatus::Ok);
        assert_eq!(kvsched_take_delta(e, &raw mut delta), KvschedStatus::Ok);
        assert_eq!(ids(delta.left, delta.n_left), [2]);
        assert_eq!((delta.n_entered, delta.n_changed), (0, 0));
        assert_eq!(
            kvsched_take_delta(ptr_null(), &raw mut delta),
            KvschedStatus::NullPointer
        );
        kvsched_engine_free(e);
    }
}

fn ptr_null() -> *mut kvsched_capi::Engine {
    std::ptr::null_mut()
}

/// Issue 44 through the C ABI: a fork shares its parent's full pages (the same page ids in both
/// tables) and writes the positions it shares; a refused fork says why and changes nothing.
#[test]
fn a_fork_shares_its_parents_pages_and_a_refused_one_changes_nothing() {
    let config = KvschedConfig {
        prefix_cache: 1,
        ..kvsched_config_default()
    };
    let mut e = std::ptr::null_mut();
    // SAFETY: every pointer comes from `kvsched_engine_new` or a local; the engine is freed once.
    unsafe {
        assert_eq!(
            kvsched_engine_new(&raw const config, &raw mut e),
            KvschedStatus::Ok
        );
        assert_eq!(
            kvsched_submit(e, &request(1, 100), std::ptr::null(), 0),
            KvschedStatus::Ok
        );
        let mut out = std::mem::zeroed::<KvschedOutput>();
        assert_eq!(kvsched_schedule(e, &raw mut out), KvschedStatus::Ok);
        assert_eq!(kvsched_complete_step(e), KvschedStatus::Ok);
        let mut shared = 7u32;
        let child2 = request(2, 100);
        assert_eq!(
            kvsched_fork(e, 1, &raw const child2, &raw mut shared),
            KvschedStatus::Ok
        );
        assert_eq!(shared, 96, "three full pages of 32 before the last token");
        let table = |id| {
            let (mut pages, mut n) = (std::ptr::null(), 0usize);
            assert_eq!(
                kvsched_page_table(e, id, &raw mut pages, &raw mut n),
                KvschedStatus::Ok
            );
            std::slice::from_raw_parts(pages, n).to_vec()
        };
        assert_eq!(table(2)[..], table(1)[..3]);
        let before = (*e).fingerprint();
        for (parent, child, status) in [
            (9, request(3, 100), KvschedStatus::UnknownRequest),
            (1, request(3, 101), KvschedStatus::Invalid),
            // A live id (a duplicate is an unknown-request code in the C ABI).
            (1, request(2, 100), KvschedStatus::UnknownRequest),
            (1, request(3, 20), KvschedStatus::Invalid),
        ] {
            assert_eq!(
                kvsched_fork(e, parent, &raw const child, &raw mut shared),
                status
            );
            assert!(!last_error().is_empty());
            assert_eq!(shared, 0);
            assert_eq!((*e).fingerprint(), before, "a refused fork changed nothing");
        }
        assert_eq!(
            kvsched_fork(e, 1, std::ptr::null(), &raw mut shared),
            KvschedStatus::NullPointer
        );
        kvsched_engine_free(e);
    }
}
