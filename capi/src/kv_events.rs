//! KV events for engines that publish them themselves (to NVIDIA Dynamo's KV router, llm-d's indexer):
//! the engine's log ([`kvsched_take_kv_events`], on when `kvsched_config.kv_events` > 0), the keys it
//! names blocks by ([`kvsched_prefix_root`], [`kvsched_chain`]), and vLLM 0.33's wire format
//! ([`kvsched_encode_kv_events`], byte-identical to msgspec's encoding of vLLM's own structs).
//!
//! A block's key is its parent's key chained with its own hash, a prompt's first block's parent being
//! the request's root: `key[0] = kvsched_chain(root, hash[0])`, `key[j] = kvsched_chain(key[j-1],
//! hash[j])`. An engine that keeps its prompts' keys (and their tokens) by key turns each stored event
//! into vLLM's `BlockStored`: the event's key is a block hash, its parent is `parent_block_hash`
//! unless it is the request's root (a first block's parent is `None` for a router, which drops blocks
//! whose parent it never saw).

use std::ffi::{c_char, CStr};

use kvsched_core::kv::Tier;
use kvsched_core::kv_events::vllm::{encode_batch, VllmEvent};
use kvsched_core::kv_events::{KvEvent, KvEventKind};

use crate::{guard, guard_id, set_error, Engine, KvschedStatus};

/// `KvschedKvEvent::kind`: the block is cached in the tier (vLLM's `BlockStored`).
pub const KVSCHED_KV_STORED: u8 = 0;
/// `KvschedKvEvent::kind`: the block is no longer cached in the tier (vLLM's `BlockRemoved`).
pub const KVSCHED_KV_REMOVED: u8 = 1;
/// `KvschedKvEvent::kind`: forget every block of this engine (vLLM's `AllBlocksCleared`; the log
/// overflowed).
pub const KVSCHED_KV_CLEARED: u8 = 2;

/// One event of the engine's KV event log.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KvschedKvEvent {
    /// The block's key (0 for a clear).
    pub key: u64,
    /// Its parent's key, the request's root for a prompt's first block (stored events only; else 0).
    pub parent: u64,
    /// [`KVSCHED_KV_STORED`], [`KVSCHED_KV_REMOVED`] or [`KVSCHED_KV_CLEARED`].
    pub kind: u8,
    /// 1: the host tier (vLLM's medium `"CPU"`); 0: the GPU (`"GPU"`).
    pub host: u8,
}

impl KvschedKvEvent {
    pub(crate) fn of(e: &KvEvent) -> Self {
        Self {
            key: e.key,
            parent: e.parent,
            kind: match e.kind {
                KvEventKind::Stored => KVSCHED_KV_STORED,
                KvEventKind::Removed => KVSCHED_KV_REMOVED,
                KvEventKind::Cleared => KVSCHED_KV_CLEARED,
            },
            host: u8::from(e.tier == Tier::Host),
        }
    }
}

/// One event in vLLM's terms, for [`kvsched_encode_kv_events`]. Pointers may be null where their
/// count is 0.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KvschedVllmEvent {
    /// Stored and removed: the blocks' hashes, in chain order.
    pub block_hashes: *const u64,
    /// Their number.
    pub n_blocks: usize,
    /// Stored: every block's tokens, in order (`block_size` each).
    pub token_ids: *const u32,
    /// Their number: `n_blocks × block_size`.
    pub n_tokens: usize,
    /// Stored: the adapter's served name, NUL-terminated UTF-8 (null: the base model).
    pub lora_name: *const c_char,
    /// Stored: the first block's parent, when `has_parent` is 1 (0: `None`, a prompt's first block).
    pub parent: u64,
    /// Stored: the adapter's numeric id (vLLM's deprecated `lora_id`), when `has_lora_id` is 1.
    pub lora_id: u64,
    /// Stored: tokens a block.
    pub block_size: u32,
    /// [`KVSCHED_KV_STORED`], [`KVSCHED_KV_REMOVED`] or [`KVSCHED_KV_CLEARED`].
    pub kind: u8,
    /// 1: the host tier (`"CPU"`); 0: the GPU (`"GPU"`).
    pub host: u8,
    /// 1 when `parent` is set.
    pub has_parent: u8,
    /// 1 when `lora_id` is set.
    pub has_lora_id: u8,
}

/// The KV events the engine's prefix cache logged since the last call (in order), valid until the
/// next call that changes the engine; none unless the engine was built with `kv_events` > 0.
///
/// # Safety
/// `engine` comes from `kvsched_engine_new`; `events` and `n` are valid.
#[no_mangle]
pub unsafe extern "C" fn kvsched_take_kv_events(
    engine: *mut Engine,
    events: *mut *const KvschedKvEvent,
    n: *mut usize,
) -> KvschedStatus {
    // SAFETY: the caller's contract: valid or null.
    let (Some(events), Some(n)) = (unsafe { events.as_mut() }, unsafe { n.as_mut() }) else {
        set_error("kvsched_take_kv_events: null events or n");
        return KvschedStatus::NullPointer;
    };
    guard(engine, |e| {
        let l = e.take_kv_events();
        (*events, *n) = (l.as_ptr(), l.len());
        Ok(())
    })
}

/// The root a live request's prompt keys chain from (its adapter identity and cache salt): the
/// parent of its first block's stored event.
///
/// # Safety
/// `engine` comes from `kvsched_engine_new`; `root` is valid.
#[no_mangle]
pub unsafe extern "C" fn kvsched_prefix_root(
    engine: *mut Engine,
    id: u64,
    root: *mut u64,
) -> KvschedStatus {
    // SAFETY: the caller's contract: valid or null.
    let Some(root) = (unsafe { root.as_mut() }) else {
        set_error("kvsched_prefix_root: null root");
        return KvschedStatus::NullPointer;
    };
    guard_id(engine, Some(id), |e| {
        *root = e.prefix_root(id)?;
        Ok(())
    })
}

/// A block's key: its parent's key (or the request's root) chained with its hash, as the pool keys it.
#[no_mangle]
pub extern "C" fn kvsched_chain(parent: u64, hash: u64) -> u64 {
    kvsched_core::kv::chain(parent, hash)
}

/// Writes the batch `[ts, events, data_parallel_rank]` in vLLM 0.33's format into `out` (`cap`
/// bytes); `*written` is its length. `KVSCHED_STATUS_CAPACITY` when `out` is too small, with
/// `*written` the bytes the batch takes (call again with a buffer that large);
/// `KVSCHED_STATUS_INVALID` for an event out of range
/// (a kind or tier, a token count that is not `n_blocks × block_size`, a name that is not UTF-8).
/// Nothing is meaningful in `out` after a refusal.
///
/// # Safety
/// `events` points to `n` events whose pointers are valid for their counts; `out` to `cap` writable
/// bytes; `written` is valid.
#[no_mangle]
pub unsafe extern "C" fn kvsched_encode_kv_events(
    events: *const KvschedVllmEvent,
    n: usize,
    ts: f64,
    data_parallel_rank: u32,
    out: *mut u8,
    cap: usize,
    written: *mut usize,
) -> KvschedStatus {
    // SAFETY: the caller's contract: valid or null.
    let Some(written) = (unsafe { written.as_mut() }) else {
        set_error("kvsched_encode_kv_events: null written");
        return KvschedStatus::NullPointer;
    };
    *written = 0;
    // SAFETY: the caller's contract: `n` events, `cap` bytes.
    let (Some(events), Some(out)) = (unsafe { slice(events, n) }, unsafe { slice_mut(out, cap) })
    else {
        set_error("kvsched_encode_kv_events: null events or out with a nonzero count");
        return KvschedStatus::NullPointer;
    };
    // Every event is checked before any is written.
    for e in events {
        // SAFETY: the caller's contract: each event's pointers are valid for their counts.
        if let Err((status, msg)) = unsafe { vllm_event(e) } {
            set_error(msg);
            return status;
        }
    }
    // SAFETY: as above; each conversion succeeded just now (a clear stands in for none).
    let vllm = events
        .iter()
        .map(|e| unsafe { vllm_event(e) }.unwrap_or(VllmEvent::Cleared));
    match encode_batch(out, ts, vllm, data_parallel_rank) {
        Ok(len) => {
            *written = len;
            KvschedStatus::Ok
        }
        Err(full) => {
            *written = full.needed;
            set_error("kvsched_encode_kv_events: the buffer cannot hold the batch (*written: the bytes it takes)");
            KvschedStatus::Capacity
        }
    }
}

type Refusal = (KvschedStatus, &'static str);

/// The event `e` describes, borrowing its arrays.
///
/// # Safety
/// `e`'s pointers are valid for their counts (or null with a count of 0).
unsafe fn vllm_event(e: &KvschedVllmEvent) -> Result<VllmEvent<'_>, Refusal> {
    let null = (
        KvschedStatus::NullPointer,
        "kvsched_encode_kv_events: a null array with a nonzero count",
    );
    let tier = match e.host {
        0 => Tier::Gpu,
        1 => Tier::Host,
        _ => {
            return Err((
                KvschedStatus::Invalid,
                "kvsched_encode_kv_events: host must be 0 or 1",
            ))
        }
    };
    // SAFETY: the caller's contract.
    let block_hashes = unsafe { slice(e.block_hashes, e.n_blocks) }.ok_or(null)?;
    match e.kind {
        KVSCHED_KV_STORED => {
            // SAFETY: the caller's contract.
            let token_ids = unsafe { slice(e.token_ids, e.n_tokens) }.ok_or(null)?;
            if e.n_blocks.checked_mul(e.block_size as usize) != Some(e.n_tokens) {
                return Err((
                    KvschedStatus::Invalid,
                    "kvsched_encode_kv_events: a stored event's n_tokens must be n_blocks × block_size",
                ));
            }
            let lora_name = if e.lora_name.is_null() {
                None
            } else {
                // SAFETY: the caller's contract: a NUL-terminated string.
                let name = unsafe { CStr::from_ptr(e.lora_name) };
                Some(name.to_str().map_err(|_| {
                    (
                        KvschedStatus::Invalid,
                        "kvsched_encode_kv_events: lora_name is not UTF-8",
                    )
                })?)
            };
            Ok(VllmEvent::Stored {
                block_hashes,
                parent: (e.has_parent != 0).then_some(e.parent),
                token_ids,
                block_size: e.block_size,
                lora_id: (e.has_lora_id != 0).then_some(e.lora_id),
                tier,
                lora_name,
            })
        }
        KVSCHED_KV_REMOVED => Ok(VllmEvent::Removed { block_hashes, tier }),
        KVSCHED_KV_CLEARED => Ok(VllmEvent::Cleared),
        _ => Err((
            KvschedStatus::Invalid,
            "kvsched_encode_kv_events: kind must be 0, 1 or 2",
        )),
    }
}

/// `n` values at `p` (none for `n` = 0, whatever `p`); `None` for a null `p` with `n` > 0.
///
/// # Safety
/// `p` is valid for `n` reads when `n` > 0.
unsafe fn slice<'a, T>(p: *const T, n: usize) -> Option<&'a [T]> {
    match (p.is_null(), n) {
        (_, 0) => Some(&[]),
        (true, _) => None,
        // SAFETY: the caller's contract.
        (false, n) => Some(unsafe { std::slice::from_raw_parts(p, n) }),
    }
}

/// `n` writable bytes at `p`, as [`slice`].
///
/// # Safety
/// `p` is valid for `n` writes when `n` > 0.
unsafe fn slice_mut<'a>(p: *mut u8, n: usize) -> Option<&'a mut [u8]> {
    match (p.is_null(), n) {
        (_, 0) => Some(&mut []),
        (true, _) => None,
        // SAFETY: the caller's contract.
        (false, n) => Some(unsafe { std::slice::from_raw_parts_mut(p, n) }),
    }
}
