//! The KV event log: what the prefix cache tells a KV-aware router about the blocks it holds, in the
//! shape of vLLM's KV events (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`), allocation-free like
//! the page-move log.
//!
//! A pool with a log ([`crate::page_pool::KvPool::log_kv_events`]) records, in order:
//!
//! - a block committed to the prefix cache: stored on the GPU;
//! - a cached block demoted to the host tier: removed from the GPU, stored on the host;
//! - a cached block reloaded (a hit on the host tier, or a commit that takes a host block over):
//!   removed from the host, stored on the GPU;
//! - a cached block dropped (evicted for room): removed from its tier.
//!
//! A block is named by its chained key ([`crate::kv::chain`]): its parent's key and its own hash, the
//! first block's parent being the request's root (its adapter identity and cache salt), so the
//! adapter is part of every key and the root names it. The engine that drains the log
//! ([`crate::scheduler::Scheduler::take_kv_events`]) knows each key's tokens and root (it computed
//! the hashes), which the wire format wants beside them.
//!
//! **Overflow.** The log has a fixed capacity. An event that does not fit empties it and leaves a
//! single [`KvEventKind::Cleared`] in its place, after which events are logged again: a consumer
//! then forgets what it knew of this cache and learns it anew from what follows. It may know fewer
//! blocks than the cache holds (an understated match routes less traffic here), never more.

use crate::kv::Tier;
use crate::storage::Buffers;

/// What happened to a block ([`KvEvent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvEventKind {
    /// The block is cached in the tier (vLLM's `BlockStored`).
    #[default]
    Stored,
    /// The block is no longer cached in the tier (vLLM's `BlockRemoved`).
    Removed,
    /// Forget every block of this cache (vLLM's `AllBlocksCleared`): the log overflowed.
    Cleared,
}

/// One event of the log ([the module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KvEvent {
    /// What happened.
    pub kind: KvEventKind,
    /// The tier it happened in (unused for [`KvEventKind::Cleared`]).
    pub tier: Tier,
    /// The block's chained key (0 for [`KvEventKind::Cleared`]).
    pub key: u64,
    /// Its parent's key, the request's root for a prompt's first block ([`KvEventKind::Stored`]
    /// only; 0 otherwise).
    pub parent: u64,
}

/// The log over a buffer of `B` ([the module docs](self)).
#[derive(Debug)]
pub(crate) struct EventLog<B: Buffers> {
    buf: B::Buf<KvEvent>,
    len: usize,
    /// Events lost to overflow since the log was created.
    overflows: u64,
}

impl<B: Buffers> EventLog<B> {
    /// A log over `buf` (its capacity is `buf.len()`, at least 1).
    pub(crate) fn new(buf: B::Buf<KvEvent>) -> Self {
        debug_assert!(!buf.is_empty(), "a log holds at least the clear");
        Self {
            buf,
            len: 0,
            overflows: 0,
        }
    }

    /// Logs `e`; a full log becomes a single clear, then takes `e`.
    pub(crate) fn push(&mut self, e: KvEvent) {
        if self.len == self.buf.len() {
            self.overflows += 1;
            self.buf[0] = KvEvent {
                kind: KvEventKind::Cleared,
                ..KvEvent::default()
            };
            self.len = 1;
            if self.buf.len() == 1 {
                return;
            }
        }
        self.buf[self.len] = e;
        self.len += 1;
    }

    /// A block stored in `tier`.
    pub(crate) fn stored(&mut self, tier: Tier, key: u64, parent: u64) {
        self.push(KvEvent {
            kind: KvEventKind::Stored,
            tier,
            key,
            parent,
        });
    }

    /// A block removed from `tier`.
    pub(crate) fn removed(&mut self, tier: Tier, key: u64) {
        self.push(KvEvent {
            kind: KvEventKind::Removed,
            tier,
            key,
            parent: 0,
        });
    }

    /// The events since the last call, in order; the log is then empty.
    pub(crate) fn take(&mut self) -> &[KvEvent] {
        let n = core::mem::take(&mut self.len);
        &self.buf[..n]
    }

    /// Times the log overflowed (each left a clear).
    pub(crate) fn overflows(&self) -> u64 {
        self.overflows
    }

    /// Its capacity.
    pub(crate) fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Feeds what it holds to `h`.
    pub(crate) fn hash_state<H: core::hash::Hasher>(&self, h: &mut H) {
        use core::hash::Hash;
        self.buf[..self.len].hash(h);
        self.overflows.hash(h);
    }
}
pub mod vllm;
