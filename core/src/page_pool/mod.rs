//! The fixed-capacity two-tier KV page pool: the built-in [`KvBackend`](crate::kv::KvBackend), with an optional prefix cache.
//!
//! Pages are `tokens_per_block` tokens each. The GPU tier and the optional host tier are each a fixed
//! page arena with a free stack. Every request slot has a page table of at most `max_blocks` entries (a
//! row of the block table attention kernels read) and a capacity in tokens. A table entry is a GPU page
//! id, or a host page id tagged [`HOST`].
//!
//! Suspension moves a request's private pages GPU → host when the host tier has room (each move is
//! logged for the copy engine, see [`KvBackend::take_moves`](crate::kv::KvBackend::take_moves)); otherwise the pages stay HELD on the GPU
//! and suspension frees nothing — which is why recompute pause and context-side preemption exist.
//!
//! With a prefix cache ([`PrefixStorage`], `prefix.rs`), committed full prompt blocks are indexed by
//! their chained key and shared: a first chunk matches its prefix block by block (a block cached on the
//! host tier is claimed, and reloaded — one page copy — by the chunk's resize), pages are
//! reference-counted, a page referenced by any row is
//! never freed, moved or overwritten, and suspension moves only private pages. Unreferenced cached blocks
//! stay matchable until space is needed; then the oldest leaf is demoted to the host tier (or dropped).
//!
//! Invariant, after every operation (checked by [`KvPool::check`]): per tier, free pages + pages held by
//! rows or cached = capacity, and no page is both free and held (plus `prefix.rs`'s). Every operation is
//! all-or-nothing.
//!
//! Storage is borrowed ([`KvStorage`]: the pool itself never allocates; place the buffers in statics,
//! on the stack, or in memory the caller owns) or, with the `alloc` feature, owned on the heap
//! (`KvPool::owned`, `owned.rs`): one type, [`KvPool<'a, B>`](KvPool), whose buffer storage `B`
//! ([`crate::storage::Buffers`]) says which.

mod adapters;
mod checks;
use crate::narrow::u32_of;
mod backend;
mod connector_slots;
mod events;
#[cfg(feature = "fault-injection")]
mod faults;
mod fork;
#[cfg(feature = "alloc")]
mod owned;
mod prefix;
#[cfg(test)]
mod prefix_tests;
mod reuse;
mod rows;
#[cfg(test)]
mod tests;
mod trial;

pub use adapters::{AdapterBuffers, AdapterPages, AdapterStorage};
pub use connector_slots::{ConnectorSlot, ConnectorStats};
#[cfg(feature = "fault-injection")]
pub use faults::{PlantFault, PoolFault};
pub use prefix::{PageInfo, PrefixStats};
pub use trial::Memo;

use crate::kv::{PageMove, Tier};
use crate::storage::{Borrowed, Buffers};
use adapters::Adapters;
use prefix::Prefix;

/// The tag of a host page in a table entry.
pub const HOST: u32 = 1 << 31;

/// A table entry whose block a sliding window gave up ([`KvPool::release_window`]): no page. Only the
/// leading [`Seq::released`] entries of a row hold it.
pub const NO_PAGE: u32 = u32::MAX;

/// The tier and page id of a table entry.
pub const fn page_of(entry: u32) -> (Tier, u32) {
    if entry & HOST != 0 {
        (Tier::Host, entry & !HOST)
    } else {
        (Tier::Gpu, entry)
    }
}

/// State of one request slot's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SeqState {
    /// No cache.
    #[default]
    None,
    /// Active on the GPU.
    Active,
    /// Active, right after a first chunk matched cached blocks on the host tier: they are claimed (held
    /// in its table) but copied up only by its first resize, so an admission that is refused copies
    /// nothing.
    Claimed,
    /// Suspended: private pages on the host tier, or HELD on the GPU; shared pages HELD on the GPU.
    Suspended,
}

/// Per-slot bookkeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Seq {
    /// Cache state.
    pub state: SeqState,
    /// Capacity in tokens.
    pub capacity: u32,
    /// Pages in the table (released ones included).
    pub blocks: u32,
    /// Leading blocks a sliding window gave up: their entries are [`NO_PAGE`], the row's pages are
    /// blocks `released..blocks` (0 for a full-attention pool).
    pub released: u32,
    /// Growth of the last `try_allocate_generation` (for revert).
    pub last_grow: u32,
    /// The most pages a GUARANTEED_NO_EVICT reservation of KV groups promises the row at once (0:
    /// none; [`crate::kv_groups`]): those it holds count against it, the rest stay reserved.
    pub peak: u32,
    /// The request's prefix root (adapter identity and salt), set with its block hashes.
    pub root: u64,
    /// Prompt blocks with a hash.
    pub hashed: u32,
    /// Leading blocks committed to (or found in) the prefix cache.
    pub committed: u32,
    /// The key of the last committed block (the root when none).
    pub chain: u64,
    /// The prompt chain's depth in the prefix index, remembered ([`Memo`]; not state).
    pub memo: Memo,
}

/// Geometry of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvPoolConfig {
    /// Tokens per page.
    pub tokens_per_block: u32,
    /// GPU pages.
    pub gpu_pages: u32,
    /// Host pages (0 = no host tier).
    pub host_pages: u32,
    /// Request slots (at least the scheduler's `N`).
    pub slots: u32,
    /// Longest page table of one request.
    pub max_blocks: u32,
}

impl KvPoolConfig {
    /// Checks the geometry: every size at least 1 (the host tier may be 0), at most 65536 slots (a table
    /// slot is a `u16`), one request's page table within `u32::MAX` tokens (capacities are `u32`), and
    /// page ids below the host tag.
    pub const fn validate(&self) -> Result<(), crate::Error> {
        if self.tokens_per_block == 0
            || self.gpu_pages == 0
            || self.slots == 0
            || self.max_blocks == 0
        {
            return Err(crate::Error::Invalid("KV pool sizes must be non-zero"));
        }
        if self.slots > u16::MAX as u32 + 1 {
            return Err(crate::Error::Invalid(
                "KV pool has more slots than a table slot can name",
            ));
        }
        if self.gpu_pages >= HOST || self.host_pages >= HOST / 2 {
            return Err(crate::Error::Invalid(
                "KV pool has more pages than a page id can name",
            ));
        }
        let blocks = if self.max_blocks < self.gpu_pages {
            self.max_blocks
        } else {
            self.gpu_pages
        };
        if blocks as u64 * self.tokens_per_block as u64 > u32::MAX as u64 {
            return Err(crate::Error::Invalid(
                "one request's page table would hold more than u32::MAX tokens",
            ));
        }
        Ok(())
    }
    /// Length of the move log the pool needs.
    pub const fn move_log_len(&self) -> usize {
        self.gpu_pages as usize + self.host_pages as usize
    }
    /// Length of the page-table buffer (and of the block-hash buffer of a prefix cache).
    pub const fn table_len(&self) -> usize {
        self.slots as usize * self.max_blocks as usize
    }
    /// Length of a prefix cache's page-entry buffer: one per page of either tier.
    pub const fn page_info_len(&self) -> usize {
        self.gpu_pages as usize + self.host_pages as usize
    }
    /// Length of a prefix cache's index: a power of two at least twice the pages.
    pub const fn index_len(&self) -> usize {
        (2 * self.page_info_len()).next_power_of_two()
    }
    /// Length of a prefix cache's change stamps (`trial.rs`): a power of two, the index's length up to
    /// 65,536 (256 KiB).
    pub const fn stamps_len(&self) -> usize {
        let index = self.index_len();
        if index < STAMPS_MAX {
            index
        } else {
            STAMPS_MAX
        }
    }
}

/// The buffers of a pool, borrowed ([`KvStorage`]) or owned (`Owned`, which
/// `KvPool::owned` allocates). Lengths: `gpu_free` = gpu_pages, `host_free` = host_pages, `tables` =
/// slots × max_blocks, `seqs` = slots, `moves` = gpu_pages + host_pages.
#[derive(Debug)]
pub struct KvBuffers<B: Buffers> {
    /// GPU free stack.
    pub gpu_free: B::Buf<u32>,
    /// Host free stack.
    pub host_free: B::Buf<u32>,
    /// Page tables, one row of `max_blocks` per slot.
    pub tables: B::Buf<u32>,
    /// Per-slot state.
    pub seqs: B::Buf<Seq>,
    /// Move log.
    pub moves: B::Buf<PageMove>,
    /// The prefix cache's buffers; `None`: no prefix cache (no page is ever shared).
    pub prefix: Option<PrefixBuffers<B>>,
}

/// The borrowed buffers of a pool (`&'a mut [T]`: statics, the stack, memory the caller owns).
pub type KvStorage<'a> = KvBuffers<Borrowed<'a>>;

/// The buffers of a prefix cache. Lengths: `pages` = [`KvPoolConfig::page_info_len`], `index` =
/// [`KvPoolConfig::index_len`], `hashes` = slots × max_blocks, `stamps` =
/// [`KvPoolConfig::stamps_len`].
#[derive(Debug)]
pub struct PrefixBuffers<B: Buffers> {
    /// One entry per page of either tier.
    pub pages: B::Buf<PageInfo>,
    /// The index of cached blocks by key.
    pub index: B::Buf<u32>,
    /// The block hashes of each slot's prompt, one row of `max_blocks` per slot.
    pub hashes: B::Buf<u64>,
    /// Change stamps by key (`trial.rs`): bumped when a key's block is indexed or dropped, or takes
    /// its first reference or gives its last.
    pub stamps: B::Buf<u32>,
}

/// The borrowed buffers of a prefix cache.
pub type PrefixStorage<'a> = PrefixBuffers<Borrowed<'a>>;

/// Counters of pool activity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct KvStats {
    /// Suspensions.
    pub suspends: u64,
    /// Pages moved GPU → host (suspended requests' and demoted cached blocks').
    pub pages_offloaded: u64,
    /// Pages moved host → GPU (resumed requests' and reloaded cached blocks').
    pub pages_reloaded: u64,
    /// Suspensions that left the pages HELD on the GPU.
    pub held_suspends: u64,
}

/// The two-tier page pool, over buffers `B` chooses: [`Borrowed`] (`&'a mut [T]`, the default: no
/// heap) or `Owned` (`Box<[T]>`, feature `alloc`: `KvPool::owned`). `'a` is
/// also the lifetime of an attached KV connector ([`KvPool::attach_connector`]).
#[derive(Debug)]
pub struct KvPool<'a, B: Buffers = Borrowed<'a>> {
    cfg: KvPoolConfig,
    gpu_free: B::Buf<u32>,
    gpu_free_len: u32,
    host_free: B::Buf<u32>,
    host_free_len: u32,
    tables: B::Buf<u32>,
    seqs: B::Buf<Seq>,
    moves: B::Buf<PageMove>,
    moves_len: usize,
    stats: KvStats,
    prefix: Option<Prefix<B>>,
    hashes: B::Buf<u64>,
    /// Unified paging: the adapters' device copies (`adapters.rs`).
    adapters: Option<Adapters<B>>,
    /// Pages of resident adapters nobody pins (unified paging; evictable).
    adapter_idle: u32,
    /// The attached KV connector and its per-slot loads (`connector_slots.rs`).
    connector: Option<connector_slots::Attached<'a>>,
    /// The clock of a pool without a prefix cache (which keeps its own).
    clock: u64,
}

/// The most change stamps a prefix cache keeps ([`KvPoolConfig::stamps_len`]).
const STAMPS_MAX: usize = 1 << 16;

const fn blocks_for(tokens: u32, tpb: u32) -> u32 {
    tokens.div_ceil(tpb)
}

impl<B: Buffers> KvPool<'_, B> {
    /// A pool over `storage` (borrowed: a [`KvStorage`]); refuses an invalid geometry
    /// ([`KvPoolConfig::validate`]) and buffers of the wrong length, without writing to them.
    pub fn new(cfg: KvPoolConfig, mut storage: KvBuffers<B>) -> Result<Self, crate::Error> {
        cfg.validate()?;
        let prefix_ok = storage.prefix.as_ref().is_none_or(|p| {
            p.pages.len() == cfg.page_info_len()
                && p.index.len() == cfg.index_len()
                && p.hashes.len() == cfg.table_len()
                && p.stamps.len() == cfg.stamps_len()
        });
        if storage.gpu_free.len() != cfg.gpu_pages as usize
            || storage.host_free.len() != cfg.host_pages as usize
            || storage.tables.len() != cfg.table_len()
            || storage.seqs.len() != cfg.slots as usize
            || storage.moves.len() != cfg.move_log_len()
            || !prefix_ok
        {
            return Err(crate::Error::Invalid(
                "KV storage buffers do not match the pool geometry",
            ));
        }
        // Free stacks pop low page ids first.
        for (i, p) in storage.gpu_free.iter_mut().enumerate() {
            *p = cfg.gpu_pages - 1 - u32_of(i);
        }
        for (i, p) in storage.host_free.iter_mut().enumerate() {
            *p = cfg.host_pages - 1 - u32_of(i);
        }
        storage.seqs.fill(Seq::default());
        let (prefix, hashes) = match storage.prefix {
            Some(mut p) => {
                p.hashes.fill(0);
                let prefix = Prefix::new(p.pages, p.index, p.stamps, cfg.gpu_pages);
                (Some(prefix), p.hashes)
            }
            None => (None, B::Buf::default()),
        };
        Ok(Self {
            cfg,
            gpu_free_len: cfg.gpu_pages,
            host_free_len: cfg.host_pages,
            gpu_free: storage.gpu_free,
            host_free: storage.host_free,
            tables: storage.tables,
            seqs: storage.seqs,
            moves: storage.moves,
            moves_len: 0,
            stats: KvStats::default(),
            prefix,
            hashes,
            adapters: None,
            adapter_idle: 0,
            connector: None,
            clock: 0,
        })
    }

    /// The geometry.
    pub fn config(&self) -> KvPoolConfig {
        self.cfg
    }
    /// Free GPU pages (on the free stack; cached blocks nobody uses can be evicted for more).
    pub fn gpu_free(&self) -> u32 {
        self.gpu_free_len
    }
    /// Free host pages.
    pub fn host_free(&self) -> u32 {
        self.host_free_len
    }
    /// Activity counters.
    pub fn stats(&self) -> KvStats {
        self.stats
    }
    /// The prefix cache's counters (`None` without a prefix cache).
    pub fn prefix_stats(&self) -> Option<PrefixStats> {
        self.prefix.as_ref().map(|p| p.stats)
    }
    /// Pages of a tier holding cached blocks (referenced or not); 0 without a prefix cache.
    pub fn cached_pages(&self, tier: Tier) -> u32 {
        self.prefix.as_ref().map_or(0, |p| p.cached(tier))
    }
    /// Pages of a tier holding cached blocks no request references (evictable, leaves first); 0 without
    /// a prefix cache.
    pub fn idle_pages(&self, tier: Tier) -> u32 {
        self.prefix.as_ref().map_or(0, |p| p.evictable(tier))
    }
    /// A page's entry in the prefix cache (`None` without one).
    pub fn page_info(&self, entry: u32) -> Option<PageInfo> {
        self.prefix.as_ref().map(|p| *p.info(entry))
    }
    /// A slot's state.
    pub fn seq(&self, slot: u16) -> Seq {
        self.seqs.get(slot as usize).copied().unwrap_or_default()
    }
    /// A slot's page table: GPU page ids, and host page ids tagged [`HOST`] ([`page_of`]); the first
    /// [`Seq::released`] entries are [`NO_PAGE`].
    pub fn table(&self, slot: u16) -> &[u32] {
        let s = self.seq(slot);
        let base = slot as usize * self.cfg.max_blocks as usize;
        &self.tables[base..base + s.blocks as usize]
    }

    /// Sliding-window attention: gives request `r`'s blocks wholly before position `keep_from` up (a
    /// committed block stays in the prefix cache, idle; another page is freed); their entries become
    /// [`NO_PAGE`]. For an active row only (elsewhere a no-op, as is a `keep_from` that leaves no
    /// whole block behind it). A window's row keeps about `window / tokens_per_block + 1` pages.
    pub fn release_window(&mut self, r: crate::kv::KvRef, keep_from: u32) {
        let Some(i) = self.slot(r) else { return };
        if self.seqs[i].state == SeqState::Active {
            self.release_window_row(i, keep_from);
        }
    }

    /// Sets the most pages request `r`'s reservation promises it at once ([`Seq::peak`]; 0 ends it).
    pub(crate) fn set_peak(&mut self, r: crate::kv::KvRef, peak: u32) {
        if let Some(i) = self.slot(r) {
            self.seqs[i].peak = peak;
        }
    }

    /// GPU pages that can be had (free, or cached and idle) and the references beyond each page's
    /// first (pages a holder's release does not free): what reservations are counted against.
    pub(crate) fn reservable(&self) -> (u32, u32) {
        let shared = self.prefix.as_ref().map_or(0, Prefix::shared);
        (self.gpu_available(), shared)
    }

    /// A fingerprint of the whole pool state: geometry, both free stacks (whole buffers, so a page that
    /// was taken and given back in another order shows), every page table row, every slot, the move log,
    /// the counters and the prefix cache. Equal before and after an operation = the operation changed
    /// nothing.
    pub fn fingerprint(&self) -> u64 {
        use core::hash::{Hash, Hasher};
        let mut h = crate::fingerprint::Fingerprint::new();
        self.cfg.hash(&mut h);
        self.gpu_free.hash(&mut h);
        self.gpu_free_len.hash(&mut h);
        self.host_free.hash(&mut h);
        self.host_free_len.hash(&mut h);
        self.tables.hash(&mut h);
        self.seqs.hash(&mut h);
        self.moves[..self.moves_len].hash(&mut h);
        self.stats.hash(&mut h);
        self.hashes.hash(&mut h);
        if let Some(p) = &self.prefix {
            p.hash_state(&mut h);
        }
        if let Some(a) = &self.adapters {
            a.hash_state(&mut h);
        }
        self.adapter_idle.hash(&mut h);
        self.connector_hash(&mut h);
        self.clock.hash(&mut h);
        h.finish()
    }

    /// A row's entries that name pages (those a sliding window released left out).
    fn row_entries(&self, slot: usize, s: &Seq) -> &[u32] {
        let base = slot * self.cfg.max_blocks as usize;
        let (from, to) = if s.state == SeqState::None {
            (0, 0)
        } else {
            (s.released as usize, s.blocks as usize)
        };
        &self.tables[base + from..base + to]
    }

    fn tier_pages(&self, tier: Tier) -> u32 {
        match tier {
            Tier::Gpu => self.cfg.gpu_pages,
            Tier::Host => self.cfg.host_pages,
        }
    }

    fn row(&self, slot: usize) -> usize {
        slot * self.cfg.max_blocks as usize
    }

    fn log_room(&self, n: u32) -> bool {
        self.moves_len + n as usize <= self.moves.len()
    }

    fn slot(&self, r: crate::kv::KvRef) -> Option<usize> {
        let i = r.slot as usize;
        (i < self.seqs.len()).then_some(i)
    }
}
