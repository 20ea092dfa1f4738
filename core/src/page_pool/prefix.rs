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
//! unreferenced (matchable, evictable once it is a leaf).
//!
//! Invariants (checked by `KvPool::check`):
//! 1. `refs` = the number of block-table rows holding the page;
//! 2. a cached page is in the index under its key, and the index holds nothing else;
//! 3. `children` = the cached pages whose parent key is this page's key;
//! 4. a tier's LRU list holds exactly its cached pages with `refs == 0 && children == 0` (oldest first);
//! 5. host pages are never referenced by a row through the cache (a match reloads them first).

use crate::kv::Tier;

use super::HOST;

/// No page (list links).
const NIL: u32 = u32::MAX;

/// One page's entry in the prefix cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PageInfo {
    refs: u32,
    children: u32,
    key: u64,
    parent: u64,
    prev: u32,
    next: u32,
    cached: bool,
}

impl Default for PageInfo {
    fn default() -> Self {
        Self {
            refs: 0,
            children: 0,
            key: 0,
            parent: 0,
            prev: NIL,
            next: NIL,
            cached: false,
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
    fn evictable(&self) -> bool {
        self.cached && self.refs == 0 && self.children == 0
    }
}

/// A block's key: its parent's key (or the request's root) chained with its own hash.
pub const fn chain(parent: u64, hash: u64) -> u64 {
    // splitmix64 finaliser over the pair: every bit of both inputs reaches every bit of the key.
    let mut z = parent ^ hash.rotate_left(29) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A tier's list of evictable cached pages, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Lru {
    head: u32,
    tail: u32,
    len: u32,
}

impl Lru {
    const EMPTY: Lru = Lru {
        head: NIL,
        tail: NIL,
        len: 0,
    };
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

/// The index and the page entries, over borrowed storage.
#[derive(Debug)]
pub(super) struct Prefix<'a> {
    pages: &'a mut [PageInfo],
    index: &'a mut [u32],
    gpu_pages: u32,
    lru: [Lru; 2],
    cached: [u32; 2],
    pub(super) stats: PrefixStats,
}

fn tier_index(tier: Tier) -> usize {
    match tier {
        Tier::Gpu => 0,
        Tier::Host => 1,
    }
}

impl<'a> Prefix<'a> {
    pub(super) fn new(pages: &'a mut [PageInfo], index: &'a mut [u32], gpu_pages: u32) -> Self {
        pages.fill(PageInfo::default());
        index.fill(0);
        Self {
            pages,
            index,
            gpu_pages,
            lru: [Lru::EMPTY; 2],
            cached: [0; 2],
            stats: PrefixStats::default(),
        }
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
        let at = at as u32;
        if at >= self.gpu_pages {
            (at - self.gpu_pages) | HOST
        } else {
            at
        }
    }

    fn tier(entry: u32) -> Tier {
        if entry & HOST != 0 {
            Tier::Host
        } else {
            Tier::Gpu
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

    /// Cached pages of a tier that can be evicted now.
    pub(super) fn evictable(&self, tier: Tier) -> u32 {
        self.lru[tier_index(tier)].len
    }

    /// The oldest evictable page of a tier.
    pub(super) fn oldest(&self, tier: Tier) -> Option<u32> {
        let head = self.lru[tier_index(tier)].head;
        (head != NIL).then(|| self.entry(head as usize))
    }

    // --- The index: open addressing by key, backward-shift deletion. ---

    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize & (self.index.len() - 1)
    }

    fn find(&self, key: u64) -> Option<usize> {
        let mask = self.index.len() - 1;
        let mut k = self.home(key);
        loop {
            let v = self.index[k];
            if v == 0 {
                return None;
            }
            if self.pages[(v - 1) as usize].key == key {
                return Some(k);
            }
            k = (k + 1) & mask;
        }
    }

    /// The page caching the block of `key`.
    pub(super) fn lookup(&self, key: u64) -> Option<u32> {
        let k = self.find(key)?;
        Some(self.entry((self.index[k] - 1) as usize))
    }

    fn index_insert(&mut self, key: u64, at: usize) {
        let mask = self.index.len() - 1;
        let mut k = self.home(key);
        while self.index[k] != 0 {
            k = (k + 1) & mask;
        }
        self.index[k] = at as u32 + 1;
    }

    fn index_remove(&mut self, key: u64) {
        let Some(mut hole) = self.find(key) else {
            panic!("a cached page is indexed");
        };
        let mask = self.index.len() - 1;
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let v = self.index[j];
            if v == 0 {
                break;
            }
            let home = self.home(self.pages[(v - 1) as usize].key);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.index[hole] = v;
                hole = j;
            }
        }
        self.index[hole] = 0;
    }

    fn index_set(&mut self, key: u64, at: usize) {
        let Some(k) = self.find(key) else {
            panic!("a cached page is indexed");
        };
        self.index[k] = at as u32 + 1;
    }

    // --- The LRU lists. ---

    fn link(&mut self, at: usize) {
        let t = tier_index(Self::tier(self.entry(at)));
        let tail = self.lru[t].tail;
        self.pages[at].prev = tail;
        self.pages[at].next = NIL;
        if tail == NIL {
            self.lru[t].head = at as u32;
        } else {
            self.pages[tail as usize].next = at as u32;
        }
        self.lru[t].tail = at as u32;
        self.lru[t].len += 1;
    }

    fn unlink(&mut self, at: usize) {
        let t = tier_index(Self::tier(self.entry(at)));
        let (prev, next) = (self.pages[at].prev, self.pages[at].next);
        if prev == NIL {
            self.lru[t].head = next;
        } else {
            self.pages[prev as usize].next = next;
        }
        if next == NIL {
            self.lru[t].tail = prev;
        } else {
            self.pages[next as usize].prev = prev;
        }
        self.pages[at].prev = NIL;
        self.pages[at].next = NIL;
        self.lru[t].len -= 1;
    }

    // --- References. ---

    /// A row takes a reference to the page.
    pub(super) fn acquire(&mut self, entry: u32) {
        let at = self.at(entry);
        if self.pages[at].evictable() {
            self.unlink(at);
        }
        self.pages[at].refs += 1;
    }

    /// A row gives its reference up. Returns whether the page is now free (not cached, unreferenced).
    pub(super) fn release(&mut self, entry: u32) -> bool {
        let at = self.at(entry);
        let p = &mut self.pages[at];
        assert!(p.refs > 0, "a released page was referenced");
        p.refs -= 1;
        if p.refs > 0 {
            return false;
        }
        if p.evictable() {
            self.link(at);
        }
        !self.pages[at].cached
    }

    /// A fresh private page enters a row.
    pub(super) fn take_private(&mut self, entry: u32) {
        let at = self.at(entry);
        assert!(
            self.pages[at] == PageInfo::default(),
            "a page off the free stack is unused"
        );
        self.pages[at].refs = 1;
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
    }

    /// The page is held by one row only and caches nothing: suspension may move it.
    pub(super) fn private(&self, entry: u32) -> bool {
        let p = &self.pages[self.at(entry)];
        p.refs == 1 && !p.cached
    }

    // --- Cached blocks. ---

    fn add_child(&mut self, parent: u64) {
        if let Some(k) = self.find(parent) {
            let at = (self.index[k] - 1) as usize;
            if self.pages[at].evictable() {
                self.unlink(at);
            }
            self.pages[at].children += 1;
        }
    }

    fn remove_child(&mut self, parent: u64) {
        if let Some(k) = self.find(parent) {
            let at = (self.index[k] - 1) as usize;
            assert!(self.pages[at].children > 0, "a parent counts its children");
            self.pages[at].children -= 1;
            if self.pages[at].evictable() {
                self.link(at);
            }
        }
    }

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
        self.add_child(parent);
        self.stats.committed += 1;
    }

    /// The cached block at `from` (unreferenced, a host page) is taken over by the row's private GPU page
    /// `to` holding the same block: the index entry, parent and children follow; `from` becomes free.
    pub(super) fn take_over(&mut self, from: u32, to: u32) {
        let (a, b) = (self.at(from), self.at(to));
        assert!(
            self.pages[a].cached && self.pages[a].refs == 0,
            "an unreferenced block"
        );
        assert!(!self.pages[b].cached, "by a private page");
        if self.pages[a].evictable() {
            self.unlink(a);
        }
        let old = self.pages[a];
        self.pages[b].cached = true;
        self.pages[b].key = old.key;
        self.pages[b].parent = old.parent;
        self.pages[b].children = old.children;
        self.index_set(old.key, b);
        self.pages[a] = PageInfo::default();
        self.cached[tier_index(Self::tier(from))] -= 1;
        self.cached[tier_index(Self::tier(to))] += 1;
        self.stats.deduplicated += 1;
    }

    /// Moves a cached block to another page (demotion to the host tier, reload to the GPU): the page
    /// `to` takes its entry (references included), `from` becomes free.
    pub(super) fn relocate(&mut self, from: u32, to: u32) {
        let (a, b) = (self.at(from), self.at(to));
        assert!(self.pages[a].cached, "a cached block moves");
        assert!(self.pages[b] == PageInfo::default(), "to a free page");
        let listed = self.pages[a].evictable();
        if listed {
            self.unlink(a);
        }
        self.pages[b] = self.pages[a];
        self.pages[b].prev = NIL;
        self.pages[b].next = NIL;
        self.pages[a] = PageInfo::default();
        let key = self.pages[b].key;
        self.index_set(key, b);
        self.cached[tier_index(Self::tier(from))] -= 1;
        self.cached[tier_index(Self::tier(to))] += 1;
        if listed {
            self.link(b);
        }
    }

    /// Drops an evictable cached block from the index; its page becomes free.
    pub(super) fn drop_block(&mut self, entry: u32) {
        let at = self.at(entry);
        assert!(
            self.pages[at].evictable(),
            "only an evictable leaf is dropped"
        );
        self.unlink(at);
        let (key, parent) = (self.pages[at].key, self.pages[at].parent);
        self.index_remove(key);
        self.pages[at] = PageInfo::default();
        self.cached[tier_index(Self::tier(entry))] -= 1;
        self.remove_child(parent);
        self.stats.evicted += 1;
    }

    /// Feeds the cache's whole state to `h`.
    pub(super) fn hash_state<H: core::hash::Hasher>(&self, h: &mut H) {
        use core::hash::Hash;
        self.pages.hash(h);
        self.index.hash(h);
        self.lru.hash(h);
        self.cached.hash(h);
        self.stats.hash(h);
    }

    /// Pages in use per tier (referenced or cached) and the sum of the reference counts.
    pub(super) fn usage(&self) -> ([u32; 2], u64) {
        let (mut used, mut refs) = ([0u32; 2], 0u64);
        for (at, p) in self.pages.iter().enumerate() {
            if p.refs > 0 || p.cached {
                used[usize::from(at as u32 >= self.gpu_pages)] += 1;
            }
            refs += u64::from(p.refs);
        }
        (used, refs)
    }

    /// Invariants 2 and 4 in O(pages + index): every cached page is indexed under its key, the index
    /// holds nothing else, the cached counts agree, and each tier's LRU list holds exactly its evictable
    /// pages.
    pub(super) fn check(&self) -> bool {
        let (mut cached, mut listed) = ([0u32; 2], [0u32; 2]);
        for (at, p) in self.pages.iter().enumerate() {
            let t = usize::from(at as u32 >= self.gpu_pages);
            if p.cached {
                cached[t] += 1;
                if self.find(p.key).map(|k| self.index[k] as usize) != Some(at + 1) {
                    return false;
                }
            } else if p.children != 0 || p.prev != NIL || p.next != NIL {
                return false;
            }
            if p.evictable() {
                listed[t] += 1;
            }
        }
        let indexed = self.index.iter().filter(|&&v| v != 0).count() as u32;
        let walk = |t: usize| {
            let (mut n, mut at) = (0u32, self.lru[t].head);
            while at != NIL && n <= self.pages.len() as u32 {
                let p = &self.pages[at as usize];
                if !p.evictable() || usize::from(at >= self.gpu_pages) != t {
                    return u32::MAX;
                }
                n += 1;
                at = p.next;
            }
            n
        };
        cached == self.cached
            && indexed == cached[0] + cached[1]
            && listed == [self.lru[0].len, self.lru[1].len]
            && walk(0) == listed[0]
            && walk(1) == listed[1]
    }

    /// Invariant 3 with a count per page (`scratch`, one per page, overwritten): every cached page's
    /// `children` is the number of cached pages whose parent is its key.
    pub(super) fn audit_children(&self, scratch: &mut [u32]) -> bool {
        scratch.fill(0);
        for p in self.pages.iter().filter(|p| p.cached) {
            if let Some(k) = self.find(p.parent) {
                scratch[(self.index[k] - 1) as usize] += 1;
            }
        }
        self.pages
            .iter()
            .zip(scratch.iter())
            .all(|(p, &n)| !p.cached || p.children == n)
    }
}
