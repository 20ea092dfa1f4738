//! KV events through the C ABI, from Rust: the log a C engine drains, the keys it recomputes from its
//! hashes, and the vLLM batch it publishes — byte for byte the core's encoding (itself held to
//! msgspec's bytes for vLLM's structs by the server's tests) — and every refusal.

use std::ffi::c_char;

use kvsched_capi::*;

#[path = "support/calls.rs"]
mod calls;
use calls::{last_error, request};
use kvsched_core::kv::Tier;
use kvsched_core::kv_events::vllm::{encode_batch, VllmEvent};

/// An engine of 8 GPU pages of 16 tokens, no host tier, a log of `log` events.
fn engine(log: u32) -> *mut Engine {
    let c = KvschedConfig {
        tokens_per_block: 16,
        gpu_pages: 8,
        host_pages: 0,
        max_blocks_per_request: 8,
        max_requests: 4,
        kv_events: log,
        ..kvsched_config_default()
    };
    let mut e = std::ptr::null_mut();
    // SAFETY: valid pointers.
    let status = unsafe { kvsched_engine_new(&raw const c, &raw mut e) };
    assert_eq!(status, KvschedStatus::Ok);
    e
}

/// Submits `id` with `hashes` (a page each) and runs passes until its prompt is computed.
///
/// # Safety
/// `e` is a live engine.
unsafe fn prefill(e: *mut Engine, id: u64, hashes: &[u64]) {
    let r = request(id, 16 * hashes.len() as u32);
    // SAFETY: the caller's engine; `hashes` lives through the call.
    unsafe {
        assert_eq!(
            kvsched_submit(e, &raw const r, hashes.as_ptr(), hashes.len()),
            KvschedStatus::Ok
        );
        let mut out = std::mem::zeroed::<KvschedOutput>();
        assert_eq!(kvsched_schedule(e, &raw mut out), KvschedStatus::Ok);
        assert_eq!(out.n_context, 1, "{}", last_error());
        assert_eq!(kvsched_complete_step(e), KvschedStatus::Ok);
    }
}

/// The events logged since the last call, copied.
///
/// # Safety
/// `e` is a live engine.
unsafe fn events(e: *mut Engine) -> Vec<KvschedKvEvent> {
    let (mut p, mut n) = (std::ptr::null(), 0);
    // SAFETY: the caller's engine; the array is read before the next call.
    unsafe {
        assert_eq!(
            kvsched_take_kv_events(e, &raw mut p, &raw mut n),
            KvschedStatus::Ok
        );
        std::slice::from_raw_parts(p, n).to_vec()
    }
}

fn keys(root: u64, hashes: &[u64]) -> Vec<u64> {
    hashes
        .iter()
        .scan(root, |k, &h| {
            *k = kvsched_chain(*k, h);
            Some(*k)
        })
        .collect()
}

#[test]
fn a_c_engine_drains_stored_and_removed_blocks_by_the_keys_it_can_recompute() {
    let e = engine(64);
    // SAFETY: `e` is live until freed below.
    unsafe {
        let hashes = [11, 12, 13, 14];
        prefill(e, 1, &hashes);
        let mut root = 0;
        assert_eq!(kvsched_prefix_root(e, 1, &raw mut root), KvschedStatus::Ok);
        let k = keys(root, &hashes);
        let got = events(e);
        assert_eq!(
            got.len(),
            4,
            "the computed prompt's 4 full blocks are stored: {got:?}"
        );
        for (j, ev) in got.iter().enumerate() {
            assert_eq!((ev.kind, ev.host), (KVSCHED_KV_STORED, 0), "{ev:?}");
            assert_eq!(ev.key, k[j]);
            assert_eq!(ev.parent, if j == 0 { root } else { k[j - 1] });
        }
        let stored = got.len();
        assert!(events(e).is_empty(), "drained");
        // The first request ends; a second of 8 pages needs the cached ones: they are removed.
        assert_eq!(kvsched_finish(e, 1), KvschedStatus::Ok);
        prefill(e, 2, &[21, 22, 23, 24, 25, 26, 27, 28][..7]);
        let got = events(e);
        let removed: Vec<u64> = got
            .iter()
            .filter(|v| v.kind == KVSCHED_KV_REMOVED)
            .map(|v| v.key)
            .collect();
        assert!(!removed.is_empty(), "{got:?}");
        assert!(
            removed.iter().all(|r| k[..stored].contains(r)),
            "{removed:?}"
        );
        assert_eq!(
            kvsched_prefix_root(e, 1, &raw mut root),
            KvschedStatus::UnknownRequest
        );
        kvsched_engine_free(e);
    }
}

#[test]
fn an_overflowing_log_becomes_one_clear() {
    let e = engine(2);
    // SAFETY: `e` is live until freed below.
    unsafe {
        prefill(e, 1, &[1, 2, 3, 4, 5]);
        let got = events(e);
        assert_eq!(got[0].kind, KVSCHED_KV_CLEARED, "{got:?}");
        assert!(got.len() <= 2);
        kvsched_engine_free(e);
    }
}

#[test]
fn a_log_without_a_prefix_cache_is_refused() {
    let c = KvschedConfig {
        prefix_cache: 0,
        kv_events: 16,
        ..kvsched_config_default()
    };
    let mut e = std::ptr::null_mut();
    // SAFETY: valid pointers.
    let status = unsafe { kvsched_engine_new(&raw const c, &raw mut e) };
    assert_eq!(status, KvschedStatus::Invalid);
    assert!(
        e.is_null() && last_error().contains("prefix cache"),
        "{}",
        last_error()
    );
}

fn stored<'a>(hashes: &'a [u64], tokens: &'a [u32], name: *const c_char) -> KvschedVllmEvent {
    KvschedVllmEvent {
        block_hashes: hashes.as_ptr(),
        n_blocks: hashes.len(),
        token_ids: tokens.as_ptr(),
        n_tokens: tokens.len(),
        lora_name: name,
        parent: 0,
        lora_id: 0,
        block_size: 2,
        kind: KVSCHED_KV_STORED,
        host: 0,
        has_parent: 0,
        has_lora_id: 0,
    }
}

/// `kvsched_encode_kv_events` over `events` into `cap` bytes: its status, its bytes.
fn encode(events: &[KvschedVllmEvent], cap: usize) -> (KvschedStatus, Vec<u8>) {
    let mut out = vec![0u8; cap];
    let mut n = usize::MAX;
    // SAFETY: the events' arrays outlive the call; `out` holds `cap` bytes.
    let s = unsafe {
        kvsched_encode_kv_events(
            events.as_ptr(),
            events.len(),
            1.5,
            3,
            out.as_mut_ptr(),
            cap,
            &raw mut n,
        )
    };
    out.truncate(if s == KvschedStatus::Ok { n } else { 0 });
    if s == KvschedStatus::Capacity {
        out = vec![0; n]; // the size the refusal asks for, zeroed
    }
    (s, out)
}

#[test]
fn the_vllm_batch_is_the_cores_encoding_of_the_same_events() {
    let (hashes, tokens) = ([7u64, u64::MAX], [1u32, 2, 3, 70_000]);
    let name = c"sql-adapter";
    let mut a = stored(&hashes, &tokens, name.as_ptr());
    (a.parent, a.has_parent, a.lora_id, a.has_lora_id, a.host) = (99, 1, 5, 1, 1);
    let b = stored(&hashes[..1], &tokens[..2], std::ptr::null());
    let removed = KvschedVllmEvent {
        kind: KVSCHED_KV_REMOVED,
        ..stored(&hashes, &[], std::ptr::null())
    };
    let cleared = KvschedVllmEvent {
        kind: KVSCHED_KV_CLEARED,
        ..stored(&[], &[], std::ptr::null())
    };
    let (s, bytes) = encode(&[a, b, removed, cleared], 4096);
    assert_eq!(s, KvschedStatus::Ok, "{}", last_error());
    let core = [
        VllmEvent::Stored {
            block_hashes: &hashes,
            parent: Some(99),
            token_ids: &tokens,
            block_size: 2,
            lora_id: Some(5),
            tier: Tier::Host,
            lora_name: Some("sql-adapter"),
        },
        VllmEvent::Stored {
            block_hashes: &hashes[..1],
            parent: None,
            token_ids: &tokens[..2],
            block_size: 2,
            lora_id: None,
            tier: Tier::Gpu,
            lora_name: None,
        },
        VllmEvent::Removed {
            block_hashes: &hashes,
            tier: Tier::Gpu,
        },
        VllmEvent::Cleared,
    ];
    let mut want = vec![0u8; 4096];
    let n = encode_batch(&mut want, 1.5, &core, 3).expect("room");
    assert_eq!(bytes, want[..n]);
    // One byte short: refused, saying how many bytes the batch takes (it said 0 before, issue 43).
    let (s, asked) = encode(&[a, b, removed, cleared], n - 1);
    assert_eq!((s, asked.len()), (KvschedStatus::Capacity, n));
    // An empty batch is a batch.
    let (s, empty) = encode(&[], 64);
    assert_eq!((s, empty[0]), (KvschedStatus::Ok, 0x93));
}

#[test]
fn bad_events_are_refused_and_nothing_is_written() {
    let (hashes, tokens) = ([7u64, 8], [1u32, 2, 3, 4]);
    let ok = stored(&hashes, &tokens, std::ptr::null());
    let bad_kind = KvschedVllmEvent { kind: 9, ..ok };
    let bad_tier = KvschedVllmEvent { host: 2, ..ok };
    let short = KvschedVllmEvent { n_tokens: 3, ..ok };
    let null = KvschedVllmEvent {
        token_ids: std::ptr::null(),
        ..ok
    };
    let bytes = [0xffu8, 0];
    let not_utf8 = KvschedVllmEvent {
        lora_name: bytes.as_ptr().cast(),
        ..ok
    };
    for (e, status, msg) in [
        (bad_kind, KvschedStatus::Invalid, "kind"),
        (bad_tier, KvschedStatus::Invalid, "host"),
        (short, KvschedStatus::Invalid, "n_tokens"),
        (null, KvschedStatus::NullPointer, "null"),
        (not_utf8, KvschedStatus::Invalid, "UTF-8"),
    ] {
        let (s, out) = encode(&[ok, e], 4096);
        assert_eq!(s, status, "{msg}");
        assert!(out.is_empty());
        assert!(last_error().contains(msg), "{}", last_error());
    }
    let mut n = 1;
    // SAFETY: null pointers with nonzero counts are refused before any read.
    let s = unsafe {
        kvsched_encode_kv_events(
            std::ptr::null(),
            1,
            0.0,
            0,
            std::ptr::null_mut(),
            0,
            &raw mut n,
        )
    };
    assert_eq!((s, n), (KvschedStatus::NullPointer, 0));
}
