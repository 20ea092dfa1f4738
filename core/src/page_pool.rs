//! The fixed-capacity two-tier KV page pool: the built-in [`KvBackend`].
//!
//! Pages are `tokens_per_block` tokens each. The GPU tier and the optional host tier are each a fixed
//! page arena with a free stack. Every request slot has a page table of at most `max_blocks` entries (a
//! row of the block table attention kernels read) and a capacity in tokens.
//!
//! Suspension moves all of a request's pages GPU → host when the host tier has room (each move is
//! logged for the copy engine, see [`KvPool::take_moves`]); otherwise the pages stay HELD on the GPU and
//! suspension frees nothing — which is why recompute pause and context-side preemption exist.
//!
//! Invariant, after every operation (checked by [`KvPool::check`]): per tier, free pages + pages held by
//! request tables = capacity. Every operation is all-or-nothing.
//!
//! Storage is borrowed ([`KvStorage`]), so the pool itself never allocates: place the buffers in
//! statics, on the stack, or in a `Vec` owned by the caller.

use crate::kv::{ContextPrep, KvBackend, KvRef, PageMove, Tier};
use crate::request::RequestId;

/// State of one request slot's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SeqState {
    /// No cache.
    #[default]
    None,
    /// Active on the GPU.
    Active,
    /// Suspended: pages on the host tier, or HELD on the GPU.
    Suspended,
}

/// Per-slot bookkeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Seq {
    /// Cache state.
    pub state: SeqState,
    /// Capacity in tokens.
    pub capacity: u32,
    /// Pages in the table.
    pub blocks: u32,
    /// The table's pages live on the host tier.
    pub on_host: bool,
    /// Growth of the last `try_allocate_generation` (for revert).
    pub last_grow: u32,
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
    /// slot is a `u16`), and one request's page table within `u32::MAX` tokens (capacities are `u32`).
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
    /// Length of the page-table buffer.
    pub const fn table_len(&self) -> usize {
        self.slots as usize * self.max_blocks as usize
    }
}

/// The borrowed buffers of a pool. Lengths: `gpu_free` = gpu_pages, `host_free` = host_pages, `tables` =
/// slots × max_blocks, `seqs` = slots, `moves` = gpu_pages + host_pages.
#[derive(Debug)]
pub struct KvStorage<'a> {
    /// GPU free stack.
    pub gpu_free: &'a mut [u32],
    /// Host free stack.
    pub host_free: &'a mut [u32],
    /// Page tables, one row of `max_blocks` per slot.
    pub tables: &'a mut [u32],
    /// Per-slot state.
    pub seqs: &'a mut [Seq],
    /// Move log.
    pub moves: &'a mut [PageMove],
}

/// Counters of pool activity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct KvStats {
    /// Suspensions.
    pub suspends: u64,
    /// Pages moved GPU → host.
    pub pages_offloaded: u64,
    /// Pages moved host → GPU.
    pub pages_reloaded: u64,
    /// Suspensions that left the pages HELD on the GPU.
    pub held_suspends: u64,
}

/// The two-tier page pool.
#[derive(Debug)]
pub struct KvPool<'a> {
    cfg: KvPoolConfig,
    gpu_free: &'a mut [u32],
    gpu_free_len: u32,
    host_free: &'a mut [u32],
    host_free_len: u32,
    tables: &'a mut [u32],
    seqs: &'a mut [Seq],
    moves: &'a mut [PageMove],
    moves_len: usize,
    stats: KvStats,
}

/// Moves a page-table row to the other tier: page `b` of `row` goes to the `b`-th page popped from the
/// destination's free stack (whose top `row.len()` entries are `popped`), the source page is pushed on its
/// tier's free stack (`pushed`, in row order), and the copy is logged. Equal lengths (the callers slice
/// them so), so the loop has no bounds checks.
fn move_pages(
    row: &mut [u32],
    popped: &[u32],
    pushed: &mut [u32],
    log: &mut [PageMove],
    request: RequestId,
    from: Tier,
) {
    let rows = row.iter_mut().zip(popped.iter().rev());
    for ((page, &dst), (free, entry)) in rows.zip(pushed.iter_mut().zip(log.iter_mut())) {
        let src = *page;
        *page = dst;
        *free = src;
        *entry = PageMove {
            request,
            from,
            src,
            dst,
        };
    }
}

const fn blocks_for(tokens: u32, tpb: u32) -> u32 {
    tokens.div_ceil(tpb)
}

impl<'a> KvPool<'a> {
    /// A pool over `storage`; refuses an invalid geometry ([`KvPoolConfig::validate`]) and buffers of
    /// the wrong length, without writing to them.
    pub fn new(cfg: KvPoolConfig, storage: KvStorage<'a>) -> Result<Self, crate::Error> {
        cfg.validate()?;
        if storage.gpu_free.len() != cfg.gpu_pages as usize
            || storage.host_free.len() != cfg.host_pages as usize
            || storage.tables.len() != cfg.table_len()
            || storage.seqs.len() != cfg.slots as usize
            || storage.moves.len() != cfg.move_log_len()
        {
            return Err(crate::Error::Invalid(
                "KV storage buffers do not match the pool geometry",
            ));
        }
        // Free stacks pop low page ids first.
        for (i, p) in storage.gpu_free.iter_mut().enumerate() {
            *p = cfg.gpu_pages - 1 - i as u32;
        }
        for (i, p) in storage.host_free.iter_mut().enumerate() {
            *p = cfg.host_pages - 1 - i as u32;
        }
        storage.seqs.fill(Seq::default());
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
        })
    }

    /// The geometry.
    pub fn config(&self) -> KvPoolConfig {
        self.cfg
    }
    /// Free GPU pages.
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
    /// A slot's state.
    pub fn seq(&self, slot: u16) -> Seq {
        self.seqs.get(slot as usize).copied().unwrap_or_default()
    }
    /// A slot's page table (page indices in the tier given by `seq(slot).on_host`).
    pub fn table(&self, slot: u16) -> &[u32] {
        let s = self.seq(slot);
        let base = slot as usize * self.cfg.max_blocks as usize;
        &self.tables[base..base + s.blocks as usize]
    }

    /// A fingerprint of the whole pool state: geometry, both free stacks (whole buffers, so a page that
    /// was taken and given back in another order shows), every page table row, every slot, the move log
    /// and the counters. Equal before and after an operation = the operation changed nothing.
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
        h.finish()
    }

    /// Page conservation per tier: free + held = capacity; every table fits its slot.
    pub fn check(&self) -> bool {
        let (mut gpu, mut host) = (0u32, 0u32);
        for s in self.seqs.iter() {
            if s.state == SeqState::None {
                if s.blocks != 0 {
                    return false;
                }
                continue;
            }
            if s.blocks > self.cfg.max_blocks
                || s.blocks < blocks_for(s.capacity, self.cfg.tokens_per_block)
            {
                return false;
            }
            if s.on_host {
                host += s.blocks;
            } else {
                gpu += s.blocks;
            }
        }
        gpu + self.gpu_free_len == self.cfg.gpu_pages
            && host + self.host_free_len == self.cfg.host_pages
    }

    fn row(&self, slot: usize) -> usize {
        slot * self.cfg.max_blocks as usize
    }

    fn release_pages(&mut self, slot: usize, from_block: u32) {
        let s = self.seqs[slot];
        let base = self.row(slot);
        for b in from_block..s.blocks {
            let page = self.tables[base + b as usize];
            if s.on_host {
                self.host_free[self.host_free_len as usize] = page;
                self.host_free_len += 1;
            } else {
                self.gpu_free[self.gpu_free_len as usize] = page;
                self.gpu_free_len += 1;
            }
        }
        self.seqs[slot].blocks = from_block.min(s.blocks);
    }

    /// Grows an active GPU-resident cache to `capacity` tokens; all-or-nothing.
    fn grow(&mut self, slot: usize, capacity: u32) -> bool {
        let s = self.seqs[slot];
        debug_assert!(!s.on_host);
        if capacity <= s.capacity {
            return true;
        }
        // The pages it holds cover the growth (the common decode step): no division, no page.
        if capacity <= s.blocks.saturating_mul(self.cfg.tokens_per_block) {
            self.seqs[slot].capacity = capacity;
            return true;
        }
        // At least one more page is needed: refuse early on an exhausted pool or a full table (the
        // eviction ladder retries after every victim).
        if self.gpu_free_len == 0 || s.blocks >= self.cfg.max_blocks {
            return false;
        }
        let need = blocks_for(capacity, self.cfg.tokens_per_block);
        if need > s.blocks {
            let add = need - s.blocks;
            if need > self.cfg.max_blocks || add > self.gpu_free_len {
                return false;
            }
            let base = self.row(slot);
            for b in s.blocks..need {
                self.gpu_free_len -= 1;
                self.tables[base + b as usize] = self.gpu_free[self.gpu_free_len as usize];
            }
            self.seqs[slot].blocks = need;
        }
        self.seqs[slot].capacity = capacity;
        true
    }

    fn log_room(&self, n: u32) -> bool {
        self.moves_len + n as usize <= self.moves.len()
    }

    /// Resumes a suspended cache, with `extra` more GPU pages needed right after; all-or-nothing.
    fn resume(&mut self, slot: usize, id: RequestId, extra: u32) -> bool {
        let s = self.seqs[slot];
        debug_assert_eq!(s.state, SeqState::Suspended);
        if s.on_host {
            if s.blocks + extra > self.gpu_free_len || !self.log_room(s.blocks) {
                return false;
            }
            let (base, n) = (self.row(slot), s.blocks as usize);
            let (g, h, m) = (
                self.gpu_free_len as usize - n,
                self.host_free_len as usize,
                self.moves_len,
            );
            move_pages(
                &mut self.tables[base..base + n],
                &self.gpu_free[g..g + n],
                &mut self.host_free[h..h + n],
                &mut self.moves[m..m + n],
                id,
                Tier::Host,
            );
            self.gpu_free_len -= s.blocks;
            self.host_free_len += s.blocks;
            self.moves_len += n;
            self.stats.pages_reloaded += s.blocks as u64;
            self.seqs[slot].on_host = false;
        } else if extra > self.gpu_free_len {
            return false;
        }
        self.seqs[slot].state = SeqState::Active;
        true
    }

    fn extra_blocks(&self, slot: usize, capacity: u32) -> u32 {
        let s = self.seqs[slot];
        blocks_for(capacity, self.cfg.tokens_per_block).saturating_sub(s.blocks)
    }

    /// `try_allocate_generation` beyond the fast path: new pages, or a suspended cache coming back.
    #[inline(never)]
    fn allocate_generation_general(&mut self, r: KvRef, grow: u32) -> bool {
        let Some(i) = self.slot(r) else { return false };
        let s = self.seqs[i];
        let Some(target) = s.capacity.checked_add(grow) else {
            return false;
        };
        match s.state {
            SeqState::None => return false,
            SeqState::Active => {
                if !self.grow(i, target) {
                    return false;
                }
            }
            SeqState::Suspended => {
                let extra = self.extra_blocks(i, target);
                if blocks_for(target, self.cfg.tokens_per_block) > self.cfg.max_blocks
                    || !self.resume(i, r.id, extra)
                {
                    return false;
                }
                let grown = self.grow(i, target);
                debug_assert!(grown, "resume reserved the growth");
            }
        }
        self.seqs[i].last_grow = grow;
        true
    }

    fn slot(&self, r: KvRef) -> Option<usize> {
        let i = r.slot as usize;
        (i < self.seqs.len()).then_some(i)
    }
}

impl KvBackend for KvPool<'_> {
    fn tier_below_gpu(&self) -> bool {
        self.cfg.host_pages > 0
    }

    fn can_evict(&self) -> bool {
        self.cfg.host_pages > 0
    }

    fn has_cache(&self, r: KvRef) -> bool {
        self.slot(r)
            .is_some_and(|i| self.seqs[i].state != SeqState::None)
    }

    fn is_active(&self, r: KvRef) -> bool {
        self.slot(r)
            .is_some_and(|i| self.seqs[i].state == SeqState::Active)
    }

    fn prepare_context(&mut self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        let i = self.slot(r)?;
        match self.seqs[i].state {
            SeqState::None if prep.first_chunk => {
                self.seqs[i] = Seq {
                    state: SeqState::Active,
                    ..Seq::default()
                };
                Some(0)
            }
            SeqState::None => None,
            SeqState::Active => Some(0),
            SeqState::Suspended => self.resume(i, r.id, 0).then_some(0),
        }
    }

    fn resize_context(&mut self, r: KvRef, capacity: u32, first_chunk: bool) -> bool {
        let Some(i) = self.slot(r) else { return false };
        if self.seqs[i].state != SeqState::Active {
            return false;
        }
        if self.grow(i, capacity) {
            return true;
        }
        if first_chunk {
            self.suspend(r);
        }
        false
    }

    #[inline]
    fn try_allocate_generation(&mut self, r: KvRef, grow: u32) -> bool {
        // The common decode step: an active cache whose pages already hold the growth; and its refusal
        // when a page is needed but none can be had (the eviction ladder retries after every victim).
        let (tpb, free, max_blocks) = (
            self.cfg.tokens_per_block,
            self.gpu_free_len,
            self.cfg.max_blocks,
        );
        if let Some(s) = self.seqs.get_mut(r.slot as usize) {
            if s.state == SeqState::Active {
                let Some(target) = s.capacity.checked_add(grow) else {
                    return false;
                };
                if u64::from(target) <= u64::from(s.blocks) * u64::from(tpb) {
                    // target >= capacity: the checked sum did not overflow.
                    s.capacity = target;
                    s.last_grow = grow;
                    return true;
                }
                if free == 0 || s.blocks >= max_blocks {
                    return false;
                }
            }
        }
        self.allocate_generation_general(r, grow)
    }

    fn revert_allocate_generation(&mut self, r: KvRef) {
        let Some(i) = self.slot(r) else { return };
        let s = self.seqs[i];
        if s.state != SeqState::Active || s.last_grow == 0 {
            return;
        }
        let cap = s.capacity - s.last_grow;
        self.seqs[i].capacity = cap;
        self.seqs[i].last_grow = 0;
        self.release_pages(i, blocks_for(cap, self.cfg.tokens_per_block));
    }

    fn suspend(&mut self, r: KvRef) {
        let Some(i) = self.slot(r) else { return };
        let s = self.seqs[i];
        if s.state != SeqState::Active {
            return;
        }
        self.stats.suspends += 1;
        self.seqs[i].state = SeqState::Suspended;
        self.seqs[i].last_grow = 0;
        if s.blocks == 0 || s.blocks > self.host_free_len || !self.log_room(s.blocks) {
            if s.blocks > 0 {
                self.stats.held_suspends += 1;
            }
            return;
        }
        let (base, n) = (self.row(i), s.blocks as usize);
        let (h, g, m) = (
            self.host_free_len as usize - n,
            self.gpu_free_len as usize,
            self.moves_len,
        );
        move_pages(
            &mut self.tables[base..base + n],
            &self.host_free[h..h + n],
            &mut self.gpu_free[g..g + n],
            &mut self.moves[m..m + n],
            r.id,
            Tier::Gpu,
        );
        self.host_free_len -= s.blocks;
        self.gpu_free_len += s.blocks;
        self.moves_len += n;
        self.stats.pages_offloaded += s.blocks as u64;
        self.seqs[i].on_host = true;
    }

    fn free(&mut self, r: KvRef) {
        let Some(i) = self.slot(r) else { return };
        if self.seqs[i].state == SeqState::None {
            return;
        }
        self.release_pages(i, 0);
        self.seqs[i] = Seq::default();
    }

    fn preempt(&mut self, r: KvRef) {
        self.free(r);
    }

    fn prepare_disagg_gen_init(&mut self, r: KvRef, capacity: u32) -> bool {
        let Some(i) = self.slot(r) else { return false };
        match self.seqs[i].state {
            SeqState::None => {
                self.seqs[i] = Seq {
                    state: SeqState::Active,
                    ..Seq::default()
                };
                if self.grow(i, capacity) {
                    true
                } else {
                    self.seqs[i] = Seq::default();
                    false
                }
            }
            SeqState::Active => self.grow(i, capacity),
            SeqState::Suspended => {
                let extra = self.extra_blocks(i, capacity);
                self.resume(i, r.id, extra) && self.grow(i, capacity)
            }
        }
    }

    fn max_tokens_per_request(&self) -> u64 {
        self.cfg.max_blocks.min(self.cfg.gpu_pages) as u64 * self.cfg.tokens_per_block as u64
    }

    fn take_moves(&mut self) -> &[PageMove] {
        let n = core::mem::take(&mut self.moves_len);
        &self.moves[..n]
    }
}

#[cfg(test)]
mod tests;
