//! The engine's KV events ([`Engine::take_kv_events`]): the core's prefix-cache events
//! ([`kvsched_core::kv_events`]: a block stored or removed, by key and tier) with what a router's
//! wire format wants beside them, which only the engine knows: each block's tokens, its parent
//! (`None` for a prompt's first block: a router drops a block whose parent it never saw, and the
//! root, the adapter identity, is no block), and its adapter.
//!
//! Every request's prompt keys are computed when it is queued (its root, from the pool, chained with
//! its block hashes, as the pool chains them) and indexed by key. The core's events are read after
//! every step's completion, while the requests that committed blocks are still queued, and translated: a stored
//! block's tokens come from the request naming its key, and are kept (the [`Book`]) while the block
//! is cached, for its later moves between tiers. A log that overflowed (a clear) rebuilds the book
//! from the blocks the pool holds. Events wait for [`Engine::take_kv_events`]; past
//! [`Book::PENDING`] of them untaken, they are replaced by one clear.

use std::collections::HashMap;

use kvsched_core::kv::{chain, Tier};
use kvsched_core::kv_events::{KvEvent, KvEventKind};

use super::{Engine, Live};

/// One KV event, with its block's tokens, parent and adapter ([`Engine::take_kv_events`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvBlockEvent {
    /// Stored, removed, or every block cleared.
    pub kind: KvEventKind,
    /// The tier (unused for a clear).
    pub tier: Tier,
    /// The block's key (0 for a clear).
    pub hash: u64,
    /// Its parent's key; `None` for a prompt's first block, a removal and a clear.
    pub parent: Option<u64>,
    /// Its tokens (a stored block's; empty otherwise).
    pub tokens: Vec<u32>,
    /// Its adapter (`None`: the base model).
    pub adapter: Option<u64>,
}

/// A cached block's record.
#[derive(Debug, Clone)]
struct Block {
    parent: Option<u64>,
    tokens: Vec<u32>,
    adapter: Option<u64>,
    /// Where it is cached (`None` between a removal and the store of a move).
    tier: Option<Tier>,
}

/// The cached blocks' records and the events not yet taken.
#[derive(Debug, Default)]
pub(super) struct Book {
    blocks: HashMap<u64, Block>,
    /// Where each queued prompt's block keys are: the slot and the block (an entry is checked
    /// against that slot's request when read; stale ones are dropped when the map outgrows them).
    queued: HashMap<u64, (u16, usize)>,
    pending: Vec<KvBlockEvent>,
}

impl Book {
    /// Events kept for [`Engine::take_kv_events`] at most; past it they become one clear.
    pub(super) const PENDING: usize = 1 << 16;
}

fn clear() -> KvBlockEvent {
    KvBlockEvent {
        kind: KvEventKind::Cleared,
        tier: Tier::Gpu,
        hash: 0,
        parent: None,
        tokens: Vec::new(),
        adapter: None,
    }
}

/// The keys of a prompt's blocks under `root`, as the pool chains them.
pub(super) fn prompt_keys(root: u64, hashes: &[u64]) -> Vec<u64> {
    hashes
        .iter()
        .scan(root, |key, &h| {
            *key = chain(*key, h);
            Some(*key)
        })
        .collect()
}

impl Engine<'_> {
    /// The KV events since the last call, oldest first: the prefix cache's blocks stored and
    /// removed, each stored one with its tokens, its parent (`None` for a prompt's first block) and
    /// its adapter; a clear where the log overflowed (or past 65,536 events untaken). None unless
    /// [`super::EngineConfig::kv_events`].
    pub fn take_kv_events(&mut self) -> Vec<KvBlockEvent> {
        std::mem::take(&mut self.events.pending)
    }

    /// The keys of a request's prompt blocks just queued in `slot` (empty without KV events),
    /// indexed for the stores that will name them.
    pub(super) fn keys_of(&mut self, slot: u16, hashes: &[u64]) -> Vec<u64> {
        if !self.cfg.kv_events {
            return Vec::new();
        }
        let keys = prompt_keys(self.sched.leader().seq(slot).root, hashes);
        let live: usize = self.live.iter().flatten().map(|l| l.keys.len()).sum();
        if self.events.queued.len() > 2 * (live + keys.len()) + 1024 {
            // Mostly stale (their requests are gone): rebuilt from the queued requests.
            let fresh = self
                .live
                .iter()
                .enumerate()
                .filter_map(|(s, l)| Some((s, l.as_ref()?)));
            self.events.queued = fresh
                .flat_map(|(s, l)| {
                    l.keys
                        .iter()
                        .enumerate()
                        .map(move |(k, &key)| (key, (s as u16, k)))
                })
                .collect();
        }
        self.events
            .queued
            .extend(keys.iter().enumerate().map(|(k, &key)| (key, (slot, k))));
        keys
    }

    /// Reads and translates the core's events (after a step's completion).
    pub(super) fn book_kv_events(&mut self) {
        if !self.cfg.kv_events {
            return;
        }
        for e in self.sched.take_kv_events() {
            let event = match e.kind {
                KvEventKind::Stored => self.stored(e),
                KvEventKind::Removed => self.removed(e),
                KvEventKind::Cleared => Some(self.cleared()),
            };
            let pending = &mut self.events.pending;
            if pending.len() >= Book::PENDING {
                pending.clear();
                pending.push(clear());
            }
            pending.extend(event);
        }
        self.events.blocks.retain(|_, b| b.tier.is_some());
    }

    fn stored(&mut self, e: KvEvent) -> Option<KvBlockEvent> {
        if !self.events.blocks.contains_key(&e.key) {
            let block = self.block_of(e.key)?;
            self.events.blocks.insert(e.key, block);
        }
        let b = self.events.blocks.get_mut(&e.key)?;
        b.tier = Some(e.tier);
        Some(KvBlockEvent {
            kind: KvEventKind::Stored,
            tier: e.tier,
            hash: e.key,
            parent: b.parent,
            tokens: b.tokens.clone(),
            adapter: b.adapter,
        })
    }

    fn removed(&mut self, e: KvEvent) -> Option<KvBlockEvent> {
        let b = self.events.blocks.get_mut(&e.key)?;
        b.tier = None;
        Some(KvBlockEvent {
            kind: KvEventKind::Removed,
            tier: e.tier,
            hash: e.key,
            parent: None,
            tokens: Vec::new(),
            adapter: b.adapter,
        })
    }

    /// A clear: the book keeps the records of the blocks the pool still holds.
    fn cleared(&mut self) -> KvBlockEvent {
        let pool = self.sched.leader();
        let c = pool.config();
        let mut held = HashMap::new();
        let host = kvsched_core::page_pool::HOST;
        let pages = (0..c.gpu_pages)
            .map(|p| (p, Tier::Gpu))
            .chain((0..c.host_pages).map(|h| (h | host, Tier::Host)));
        for (entry, tier) in pages {
            if let Some(info) = pool
                .page_info(entry)
                .filter(kvsched_core::page_pool::PageInfo::cached)
            {
                held.insert(info.key(), tier);
            }
        }
        self.events.blocks.retain(|k, b| {
            b.tier = held.get(k).copied();
            b.tier.is_some()
        });
        clear()
    }

    /// The record of a block a queued request's prompt names.
    fn block_of(&self, key: u64) -> Option<Block> {
        let tpb = self.cfg.tokens_per_block as usize;
        let indexed = self.events.queued.get(&key).and_then(|&(slot, k)| {
            let l: &Live = self.live.get(usize::from(slot))?.as_ref()?;
            (l.keys.get(k) == Some(&key)).then_some((l, k))
        });
        // A stale entry (another request with the same prompt took its place, then ended): a scan.
        let (l, k) = indexed.or_else(|| {
            self.live
                .iter()
                .flatten()
                .find_map(|l: &Live| Some((l, l.keys.iter().position(|&x| x == key)?)))
        })?;
        Some(Block {
            parent: k.checked_sub(1).map(|p| l.keys[p]),
            tokens: l.tokens.get(k * tpb..(k + 1) * tpb)?.to_vec(),
            adapter: l.adapter,
            tier: None,
        })
    }
}
