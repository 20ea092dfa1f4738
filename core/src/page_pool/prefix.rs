//! The prefix cache of the page pool: an index of committed full blocks, by chained key, over
//! reference-counted pages, and the least-recently-used lists of the cached blocks nobody references.
//!
//! A block's key chains its parent's key and its own hash ([`chain`]); the first block's parent is the
//! request's *root*: its adapter identity and cache salt (the scheduler computes it), so KV computed under
//! one adapter is never matched under another, nor under the base model. Keys are stable wherever the block
//! lives, so a block demoted to the host tier or reloaded keeps its place in the chain.
//!
//! Every page of either tier has a [`PageInfo`] (the page's entry in this cache's storage, by *info
//! index*: GPU page `p` at `p`, host page `h` at `gpu_pages + h`). A page is in exactly one of three
//! states: free (on its tier's free stack), referenced (`refs` block tables hold it), or cached and
//! unreferenced (*idle*: matchable, evictable leaf first).
//!
//! Eviction is leaf first, so that no cached block outlives its parent (an orphan could never be
//! matched): on the GPU a leaf is an idle block with no child *on the GPU* — it is demoted to the host
//! tier, where its children already are, or dropped when it has no child at all; on the host tier a
//! leaf has no child at all, and is dropped. A block moves up (reload) only after its parent, and down
//! (demotion) only after its children, so a GPU block's parent is on the GPU and a host block's children
//! are on the host. A row holding a block holds its parent, so an idle block's children are idle: every
//! idle block can be evicted once its descendants are, and a tier can give back all its idle pages.
//!
//! Invariants (checked by `KvPool::check` and `KvPool::audit`):
//! 1. `refs` = the number of block-table rows holding the page;
//! 2. a cached page is in the index under its key, and the index holds nothing else;
//! 3. `children` (`gpu_children`) = the cached pages (on the GPU) whose parent key is this page's key;
//! 4. a tier's LRU list holds exactly its leaves (oldest first), and `idle` counts its idle pages;
//! 5. a host page is referenced by one row at most: its private page, or a cached block it claimed (a
//!    match stops at a host block another row claimed) and reloads before it runs;
//! 6. a GPU block's cached parent is on the GPU.
//!
//! A sliding-window group's cache (`set_window`, `kv_groups`) differs: its rows hold only their window,
//! so a block's parent may be released and evicted while the block is cached. Every idle block is a
//! leaf there, evicted in LRU order whatever its children (an orphan stays matchable by its chained key:
//! a window's hit needs only the blocks of the last window before the hit point), no child counts are
//! kept, and invariants 3 and 6 are a full cache's only.
//!
//! The LRU lists (and the counts that decide a leaf) are in `prefix/lru.rs`.

use super::HOST;
use crate::kv_events::EventLog;
use crate::{kv::Tier, storage::Buffers};

mod checks;
#[cfg(feature = "fault-injection")]
mod faults;
mod index;
mod lru;
use crate::narrow::u32_of;
use lru::Lru;

/// No page (list links).
const NIL: u32 = u32::MAX;

/// One page's entry in the prefix cache: a cache line of its own (an eviction, a demotion or a match
/// touches entries at random; one straddling two lines would cost two misses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(align(64))]
pub struct PageInfo {
    refs: u32,
    /// Saves reading the page (a KV connector's): it is not idle, so never evicted, until they end.
    holds: u32,
    children: u32,
    gpu_children: u32,
    key: u64,
    parent: u64,
    /// The position of its index entry (meaningful when cached).
    entry: u32,
    /// Where the parent's block was cached when last looked up (`Prefix::parent_of`; a hint, checked
    /// against the parent's key before it is used).
    above: u32,
    prev: u32,
    next: u32,
    /// When it became a leaf (the pool's clock): the LRU order, comparable with idle adapters'.
    since: u64,
    cached: bool,
    listed: bool,
}

impl Default for PageInfo {
    fn default() -> Self {
        Self {
            refs: 0,
            holds: 0,
            children: 0,
            gpu_children: 0,
            key: 0,
            parent: 0,
            above: NIL,
            entry: 0,
            prev: NIL,
            next: NIL,
            since: 0,
            cached: false,
            listed: false,
        }
    }
}

impl PageInfo {
    /// Block tables holding the page.
    pub fn refs(&self) -> u32 {
        self.refs
    }
    /// The page holds a committed block in the index.
    pub fn cached(&self) -> bool {
        self.cached
    }
    /// The key of the block the page caches (meaningful when [`PageInfo::cached`]).
    pub fn key(&self) -> u64 {
        self.key
    }
    /// Saves reading the page.
    pub fn holds(&self) -> u32 {
        self.holds
    }
    fn idle(&self) -> bool {
        self.cached && self.refs == 0 && self.holds == 0
    }
}

/// Counters of the prefix cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PrefixStats {
    /// Blocks matched on the GPU by a first chunk.
    pub gpu_hits: u64,
    /// Blocks matched on the host tier and reloaded (one page copy each).
    pub host_hits: u64,
    /// Blocks committed to the index.
    pub committed: u64,
    /// Blocks found already cached at commit (the request's copy released for the cached one).
    pub deduplicated: u64,
    /// Cached blocks dropped to make room.
    pub evicted: u64,
    /// Cached blocks demoted from the GPU to the host tier.
    pub demoted: u64,
}

/// The index and the page entries, over the pool's buffers.
#[derive(Debug)]
pub(super) struct Prefix<B: Buffers> {
    pages: B::Buf<PageInfo>,
    index: B::Buf<u32>,
    gpu_pages: u32,
    lru: [Lru; 2],
    cached: [u32; 2],
    idle: [u32; 2],
    clock: u64,
    /// A sliding window's pool: the blocks a query reads before its own (`window / tokens_per_block`),
    /// 0 for full attention. In a window's pool blocks are evicted whatever their children (below).
    window: u32,
    /// References beyond each page's first (`Σ max(refs − 1, 0)`): pages a holder's release does not
    /// free (what KV groups' reservations count, `kv_groups`).
    shared: u32,
    /// Cached host blocks that rows reference (claimed by a first chunk's match, not yet reloaded): a
    /// match stops at one another row claimed, so while there is none a chain's match is its depth
    /// (`trial.rs`).
    claims: u32,
    /// Bumped whenever a chain's indexed or held frontier can move (`trial.rs`): a key indexed or
    /// dropped, a cached block's first reference taken or its last given back.
    version: u64,
    /// The same changes by key: the stamp of the key's bucket is bumped ([`Prefix::stamp_at`]), so a
    /// frontier whose two keys' stamps stand has not moved, whatever the version did.
    stamps: B::Buf<u32>,
    /// Pages in use per tier (referenced or cached: a [`PageInfo`] that is not the default), kept as
    /// they change so that `KvPool::check_counts` proves conservation in O(1).
    used: [u32; 2],
    /// The KV event log, when one is attached (`KvPool::log_kv_events`).
    pub(super) events: Option<EventLog<B>>,
    pub(super) stats: PrefixStats,
}

fn tier_index(tier: Tier) -> usize {
    match tier {
        Tier::Gpu => 0,
        Tier::Host => 1,
    }
}

impl<B: Buffers> Prefix<B> {
    pub(super) fn new(
        mut pages: B::Buf<PageInfo>,
        mut index: B::Buf<u32>,
        mut stamps: B::Buf<u32>,
        gpu_pages: u32,
    ) -> Self {
        pages.fill(PageInfo::default());
        index.fill(0);
        stamps.fill(0);
        Self {
            pages,
            index,
            gpu_pages,
            lru: [Lru::EMPTY; 2],
            cached: [0; 2],
            idle: [0; 2],
            clock: 0,
            window: 0,
            shared: 0,
            claims: 0,
            version: 0,
            stamps,
            used: [0; 2],
            events: None,
            stats: PrefixStats::default(),
        }
    }

    /// Makes this the cache of a sliding-window group reading `blocks` blocks before a query's own
    /// (the window's release and hits are `KvGroups`'): every idle block is evictable, in LRU order,
    /// whatever its children, since a window's hit needs only the last blocks before the hit point and
    /// a row holds only its window's blocks. No child counts are kept (invariants 3 and 6 are a full
    /// cache's). Set on an empty cache.
    pub(super) fn set_window(&mut self, blocks: u32) {
        assert!(
            self.cached == [0; 2] && blocks > 0,
            "a window is set on an empty cache"
        );
        self.window = blocks;
    }

    /// The blocks a window group's query reads before its own (0: full attention).
    pub(super) fn window(&self) -> u32 {
        self.window
    }

    /// The info index of a table entry (GPU page, or host page tagged [`HOST`]).
    fn at(&self, entry: u32) -> usize {
        if entry & HOST != 0 {
            (self.gpu_pages + (entry & !HOST)) as usize
        } else {
            entry as usize
        }
    }

    /// The table entry of an info index.
    fn entry(&self, at: usize) -> u32 {
        let at = u32_of(at);
        if at >= self.gpu_pages {
            (at - self.gpu_pages) | HOST
        } else {
            at
        }
    }

    /// The entry of a page.
    pub(super) fn info(&self, entry: u32) -> &PageInfo {
        &self.pages[self.at(entry)]
    }

    /// Cached pages of a tier (referenced or not).
    pub(super) fn cached(&self, tier: Tier) -> u32 {
        self.cached[tier_index(tier)]
    }

    /// Idle cached pages of a tier: all of them can be evicted, leaves first.
    pub(super) fn evictable(&self, tier: Tier) -> u32 {
        self.idle[tier_index(tier)]
    }

    /// The oldest evictable page of a tier.
    pub(super) fn oldest(&self, tier: Tier) -> Option<u32> {
        let head = self.lru[tier_index(tier)].head;
        (head != NIL).then(|| self.entry(head as usize))
    }

    /// When the oldest evictable GPU page became a leaf.
    pub(super) fn oldest_gpu_since(&self) -> Option<u64> {
        let head = self.lru[0].head;
        (head != NIL).then(|| self.pages[head as usize].since)
    }

    /// The next reading of the pool's clock.
    pub(super) fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    // --- References. ---

    /// A row takes a reference to the page.
    pub(super) fn acquire(&mut self, entry: u32) {
        let at = self.at(entry);
        self.count_idle(at, -1);
        self.shared += u32::from(self.pages[at].refs > 0);
        self.first_or_last_ref(at, 1);
        // Not counted in use: a row takes a reference to a page in use (cached, or another row's);
        // one taken to a free page is a defect `check_counts` then finds.
        self.pages[at].refs += 1;
        self.relist(at);
    }

    /// A cached block on the host tier (a row's reference to it is a claim).
    fn claimable(&self, at: usize) -> bool {
        self.pages[at].cached && u32_of(at) >= self.gpu_pages
    }

    /// Page `at` is about to take its first reference (`+1`, refs 0 before) or gave its last (`-1`,
    /// refs 0 after): for a cached block, a frontier may move (the version) and a host one's claim
    /// begins or ends.
    #[inline(always)]
    fn first_or_last_ref(&mut self, at: usize, sign: i32) {
        let p = &self.pages[at];
        if p.cached && p.refs == 0 {
            let key = p.key;
            self.moved(key);
            if u32_of(at) >= self.gpu_pages {
                self.claims = self.claims.wrapping_add_signed(sign);
            }
        }
    }

    /// Cached host blocks rows reference.
    pub(super) fn claims(&self) -> u32 {
        self.claims
    }

    /// The frontiers' version (`trial.rs`): unchanged, no chain's indexed or held frontier moved.
    pub(super) fn version(&self) -> u64 {
        self.version
    }

    /// The block of `key` was indexed or dropped, or took its first reference or gave its last: the
    /// version and the key's stamp move.
    pub(super) fn moved(&mut self, key: u64) {
        self.version += 1;
        let at = self.stamp_at(key) as usize;
        self.stamps[at] = self.stamps[at].wrapping_add(1);
    }

    /// Where the stamp of `key` is kept (a bucket shared by many keys: a bump of one reads as a move
    /// of all, never the other way round).
    pub(super) fn stamp_at(&self, key: u64) -> u32 {
        let mask = self.stamps.len() as u64 - 1;
        u32_of((key.wrapping_mul(0xd6e8_feb8_6659_fd93) >> 32 & mask) as usize)
    }

    /// The stamp kept at `at` (an index [`Prefix::stamp_at`] gave).
    pub(super) fn stamp(&self, at: u32) -> u32 {
        self.stamps[at as usize]
    }

    /// References beyond each page's first: the pages that stay held when one holder releases them.
    pub(super) fn shared(&self) -> u32 {
        self.shared
    }

    /// A row gives its reference up. Returns whether the page is now free (not cached, unreferenced).
    pub(super) fn release(&mut self, entry: u32) -> bool {
        let at = self.at(entry);
        assert!(self.pages[at].refs > 0, "a released page was referenced");
        self.shared -= u32::from(self.pages[at].refs > 1);
        self.pages[at].refs -= 1;
        self.first_or_last_ref(at, -1);
        self.count_idle(at, 1);
        self.relist(at);
        let freed = self.pages[at].refs == 0 && !self.pages[at].cached;
        self.note_used(at, freed, -1);
        freed
    }

    /// Counts page `at` in (`+1`) or out of (`-1`) its tier's pages in use, when `changed`.
    fn note_used(&mut self, at: usize, changed: bool, sign: i32) {
        if changed {
            let t = usize::from(u32_of(at) >= self.gpu_pages);
            self.used[t] = self.used[t].wrapping_add_signed(sign);
        }
    }

    /// Pages in use per tier, as counted when they changed ([`Prefix::usage`] counts them anew).
    pub(super) fn used(&self) -> [u32; 2] {
        self.used
    }

    /// A save starts reading the cached page: it stays (not idle, never evicted) until it is released.
    pub(super) fn hold(&mut self, entry: u32) {
        let at = self.at(entry);
        assert!(self.pages[at].cached, "a save reads a cached block");
        self.count_idle(at, -1);
        self.pages[at].holds += 1;
        self.relist(at);
    }

    /// A save has read the page.
    pub(super) fn unhold(&mut self, entry: u32) {
        let at = self.at(entry);
        assert!(self.pages[at].holds > 0, "a released hold was taken");
        self.pages[at].holds -= 1;
        self.count_idle(at, 1);
        self.relist(at);
    }

    /// A fresh private page enters a row.
    pub(super) fn take_private(&mut self, entry: u32) {
        let at = self.at(entry);
        let p = &mut self.pages[at];
        assert!(
            p.refs == 0 && !p.cached,
            "a page off the free stack is unused"
        );
        p.refs = 1;
        self.note_used(at, true, 1);
    }

    /// A private page of a row moves to another page (suspend, resume): the entry follows.
    pub(super) fn move_private(&mut self, from: u32, to: u32) {
        let (a, b) = (self.at(from), self.at(to));
        assert!(
            self.pages[a].refs == 1 && !self.pages[a].cached,
            "only a private page moves"
        );
        assert!(self.pages[b] == PageInfo::default(), "to a free page");
        self.pages[b].refs = 1;
        self.pages[a] = PageInfo::default();
        self.note_used(a, true, -1);
        self.note_used(b, true, 1);
    }

    /// The page is held by one row only and caches nothing: suspension may move it.
    pub(super) fn private(&self, entry: u32) -> bool {
        let p = &self.pages[self.at(entry)];
        p.refs == 1 && !p.cached
    }

    // --- Cached blocks. ---

    /// Commits a row's private GPU page as the block of `key` (child of `parent`).
    pub(super) fn commit(&mut self, entry: u32, key: u64, parent: u64) {
        let at = self.at(entry);
        assert!(
            entry & HOST == 0 && self.pages[at].refs >= 1,
            "a committed page is a row's"
        );
        assert!(!self.pages[at].cached, "a page is committed once");
        self.pages[at].cached = true;
        self.pages[at].key = key;
        self.pages[at].parent = parent;
        self.index_insert(key, at);
        self.cached[0] += 1;
        let up = self.parent_of(at);
        self.adopt(up, true, 1);
        self.stats.committed += 1;
        if let Some(log) = self.events.as_mut() {
            log.stored(Tier::Gpu, key, parent);
        }
    }

    /// Logs a cached block's move between tiers (`up`: to the GPU).
    fn log_move(&mut self, key: u64, parent: u64, up: bool) {
        if let Some(log) = self.events.as_mut() {
            let (from, to) = if up {
                (Tier::Host, Tier::Gpu)
            } else {
                (Tier::Gpu, Tier::Host)
            };
            log.removed(from, key);
            log.stored(to, key, parent);
        }
    }

    /// The cached block at `from` (idle, a host page) is taken over by the row's private GPU page `to`
    /// holding the same block: the index entry, parent and children follow; `from` becomes free.
    pub(super) fn take_over(&mut self, from: u32, to: u32) {
        let (a, b) = (self.at(from), self.at(to));
        assert!(
            self.pages[a].idle() && from & HOST != 0,
            "an idle host block"
        );
        assert!(
            !self.pages[b].cached && to & HOST == 0,
            "by a private GPU page"
        );
        self.count_idle(a, -1);
        if self.pages[a].listed {
            self.unlink(a);
        }
        let old = self.pages[a];
        let p = &mut self.pages[b];
        (p.cached, p.key, p.parent, p.above) = (true, old.key, old.parent, old.above);
        p.entry = old.entry;
        (p.children, p.gpu_children) = (old.children, old.gpu_children);
        self.index_set(b);
        self.moved(old.key);
        self.pages[a] = PageInfo::default();
        self.note_used(a, true, -1);
        self.cached[1] -= 1;
        self.cached[0] += 1;
        let up = self.parent_of(b);
        self.gpu_child(up, 1);
        self.stats.deduplicated += 1;
        self.log_move(old.key, old.parent, true);
    }

    /// The parent's page `up` ([`Prefix::parent_of`]) gains (`+1`) or loses (`-1`) a child on the
    /// GPU, the count of all its children unchanged (a child moved between tiers).
    fn gpu_child(&mut self, up: Option<usize>, sign: i32) {
        if let Some(at) = up {
            let p = &mut self.pages[at];
            p.gpu_children = p.gpu_children.wrapping_add_signed(sign);
            self.relist(at);
        }
    }

    /// Moves a cached block to a free page of the other tier (demotion to the host tier, reload to the
    /// GPU): the page `to` takes its entry (references included), `from` becomes free.
    pub(super) fn relocate(&mut self, from: u32, to: u32) {
        let (a, b) = (self.at(from), self.at(to));
        assert!(self.pages[a].cached, "a cached block moves");
        assert!(self.pages[b] == PageInfo::default(), "to a free page");
        assert!((from ^ to) & HOST != 0, "to the other tier");
        self.count_idle(a, -1);
        if self.pages[a].listed {
            self.unlink(a);
        }
        self.pages[b] = self.pages[a];
        if self.pages[b].refs > 0 {
            // A claimed block reloaded (a referenced one is never demoted).
            self.claims -= u32::from(self.claimable(a));
            self.claims += u32::from(self.claimable(b));
        }
        let (key, parent) = (self.pages[b].key, self.pages[b].parent);
        self.index_set(b);
        self.pages[a] = PageInfo::default();
        self.note_used(a, true, -1);
        self.note_used(b, true, 1);
        let up = to & HOST == 0;
        self.cached[usize::from(up)] -= 1;
        self.cached[usize::from(!up)] += 1;
        self.count_idle(b, 1);
        self.relist(b);
        let above = self.parent_of(b);
        self.gpu_child(above, if up { 1 } else { -1 });
        self.log_move(key, parent, up);
    }

    /// Drops a leaf with no children from the index; its page becomes free.
    pub(super) fn drop_block(&mut self, entry: u32) {
        let at = self.at(entry);
        assert!(
            self.leaf(at) && self.pages[at].children == 0,
            "only a childless leaf is dropped"
        );
        self.count_idle(at, -1);
        self.unlink(at);
        let key = self.pages[at].key;
        let up = self.parent_of(at);
        self.index_remove(key);
        self.pages[at] = PageInfo::default();
        self.note_used(at, true, -1);
        let gpu = entry & HOST == 0;
        self.cached[usize::from(!gpu)] -= 1;
        self.adopt(up, gpu, -1);
        self.stats.evicted += 1;
        if let Some(log) = self.events.as_mut() {
            log.removed(if gpu { Tier::Gpu } else { Tier::Host }, key);
        }
    }

    /// The oldest leaf of a tier has children (on the host tier): it cannot be dropped, only demoted.
    pub(super) fn has_children(&self, entry: u32) -> bool {
        self.pages[self.at(entry)].children > 0
    }

    /// Feeds the cache's whole state to `h`.
    pub(super) fn hash_state<H: core::hash::Hasher>(&self, h: &mut H) {
        use core::hash::Hash;
        self.pages.hash(h);
        self.index.hash(h);
        self.lru.hash(h);
        self.cached.hash(h);
        self.window.hash(h);
        self.shared.hash(h);
        self.claims.hash(h);
        self.used.hash(h);
        if let Some(log) = &self.events {
            log.hash_state(h);
        }
        self.stats.hash(h);
    }

    /// The saves' holds on every page.
    pub(super) fn total_holds(&self) -> u64 {
        self.pages.iter().map(|p| u64::from(p.holds)).sum()
    }

    /// Pages in use per tier (referenced or cached) and the sum of the reference counts.
    pub(super) fn usage(&self) -> ([u32; 2], u64) {
        let (mut used, mut refs) = ([0u32; 2], 0u64);
        for (at, p) in self.pages.iter().enumerate() {
            if p.refs > 0 || p.cached {
                used[usize::from(u32_of(at) >= self.gpu_pages)] += 1;
            }
            refs += u64::from(p.refs);
        }
        (used, refs)
    }
}
