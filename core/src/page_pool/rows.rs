//! What the pool does to one row: pages taken (evicting cached blocks when none is free), released,
//! moved down on suspension and up on resumption (a prompt prefix's match and commit are `reuse.rs`).
//!
//! Every operation is all-or-nothing: what it needs (pages, room in the move log) is checked before
//! anything changes, and an eviction it makes on the way frees the page it takes (an idle adapter's
//! eviction frees all its pages).

use crate::ids::RequestId;
use crate::kv::{PageMove, Tier};

use super::{blocks_for, page_of, KvPool, Seq, SeqState, HOST, NO_PAGE};
use crate::kv::chain;
use crate::narrow::u32_of;
use crate::storage::Buffers;

/// Moves a row of private pages to the other tier in one loop (a pool without a prefix cache, whose
/// pages are all private): page `b` of `row` goes to the `b`-th page popped from the destination's free
/// stack (`popped`, its top `row.len()` entries), tagged [`HOST`] when it goes down (`DOWN`); the
/// source page is pushed on its tier's free stack (`pushed`, in row order), and the copy is logged.
/// Equal lengths (the callers slice them so), so the loop has no bounds checks.
fn move_pages<const DOWN: bool>(
    row: &mut [u32],
    popped: &[u32],
    pushed: &mut [u32],
    log: &mut [PageMove],
    request: RequestId,
) {
    let from = if DOWN { Tier::Gpu } else { Tier::Host };
    let rows = row.iter_mut().zip(popped.iter().rev());
    for ((page, &dst), (free, entry)) in rows.zip(pushed.iter_mut().zip(log.iter_mut())) {
        let src = if DOWN { *page } else { *page & !HOST };
        *page = if DOWN { dst | HOST } else { dst };
        *free = src;
        *entry = PageMove {
            request,
            from,
            src,
            dst,
        };
    }
}

impl<B: Buffers> KvPool<'_, B> {
    /// GPU pages that can be had: free, or held by cached blocks nobody uses.
    pub(super) fn gpu_available(&self) -> u32 {
        self.gpu_free_len
            + self.prefix.as_ref().map_or(0, |p| p.evictable(Tier::Gpu))
            + self.adapter_idle
    }

    pub(super) fn host_available(&self) -> u32 {
        self.host_free_len + self.prefix.as_ref().map_or(0, |p| p.evictable(Tier::Host))
    }

    pub(super) fn push_free(&mut self, entry: u32) {
        match page_of(entry) {
            (Tier::Gpu, p) => {
                self.gpu_free[self.gpu_free_len as usize] = p;
                self.gpu_free_len += 1;
            }
            (Tier::Host, h) => {
                self.host_free[self.host_free_len as usize] = h;
                self.host_free_len += 1;
            }
        }
    }

    fn log(&mut self, request: RequestId, from: Tier, src: u32, dst: u32) {
        self.moves[self.moves_len] = PageMove {
            request,
            from,
            src,
            dst,
        };
        self.moves_len += 1;
        match from {
            Tier::Gpu => self.stats.pages_offloaded += 1,
            Tier::Host => self.stats.pages_reloaded += 1,
        }
    }

    /// A free host page, dropping the oldest host leaf (an idle cached block with no child) when none is
    /// free.
    fn take_host(&mut self) -> Option<u32> {
        if self.host_free_len == 0 {
            let prefix = self.prefix.as_mut()?;
            let h = prefix.oldest(Tier::Host)?;
            prefix.drop_block(h);
            self.push_free(h);
        }
        self.host_free_len -= 1;
        Some(self.host_free[self.host_free_len as usize])
    }

    /// Frees at least one GPU page by evicting the oldest GPU leaf (an idle cached block with no child on
    /// the GPU), or an idle adapter that became idle before it (unified paging, `adapters.rs`): demoted to the host tier (one page copy) when it has a page for it and the move log has
    /// room for this copy and `reserve` more; else dropped, after the host leaves below it when the log
    /// was the obstacle (no orphan is left). Returns whether there was one.
    pub(super) fn evict_gpu(&mut self, who: RequestId, reserve: u32) -> bool {
        // Unified paging: an idle adapter that became idle before the oldest leaf goes instead (all
        // its pages at once).
        let idle = self.adapters.as_ref().filter(|_| self.adapter_idle > 0);
        if let Some((t, since)) = idle.and_then(super::adapters::Adapters::oldest_idle) {
            let leaf = self
                .prefix
                .as_ref()
                .and_then(super::prefix::Prefix::oldest_gpu_since);
            if leaf.is_none_or(|l| since < l) {
                self.evict_adapter(t);
                return true;
            }
        }
        let Some(p) = self.prefix.as_ref().and_then(|x| x.oldest(Tier::Gpu)) else {
            return false;
        };
        if self.cfg.host_pages > 0 && self.log_room(reserve + 1) {
            if let Some(h) = self.take_host() {
                self.log(who, Tier::Gpu, p, h);
                if let Some(prefix) = self.prefix.as_mut() {
                    prefix.relocate(p, h | HOST);
                    prefix.stats.demoted += 1;
                }
                self.push_free(p);
                return true;
            }
        }
        // Children of a GPU leaf are on the host tier, whose leaves go first.
        while self.prefix.as_ref().is_some_and(|x| x.has_children(p)) {
            let Some(h) = self.prefix.as_ref().and_then(|x| x.oldest(Tier::Host)) else {
                panic!("a host tier with cached blocks has a leaf");
            };
            if let Some(prefix) = self.prefix.as_mut() {
                prefix.drop_block(h);
            }
            self.push_free(h);
        }
        if let Some(prefix) = self.prefix.as_mut() {
            prefix.drop_block(p);
        }
        self.push_free(p);
        true
    }

    /// Drops the idle cached blocks, leaves first (host leaves, then GPU leaves, whose parents become
    /// leaves in turn); stops at a GPU leaf whose host child a request holds. Returns how many.
    pub(super) fn drop_idle(&mut self) -> u32 {
        let mut dropped = 0;
        while let Some(prefix) = self.prefix.as_mut() {
            let host = prefix.oldest(Tier::Host);
            let gpu = || {
                prefix
                    .oldest(Tier::Gpu)
                    .filter(|&p| !prefix.has_children(p))
            };
            let Some(entry) = host.or_else(gpu) else {
                break;
            };
            prefix.drop_block(entry);
            self.push_free(entry);
            dropped += 1;
        }
        dropped
    }

    /// A GPU page off the free stack, evicting a cached block for it when none is free (`reserve`: moves
    /// the caller still logs after this). Its prefix entry is the caller's to set.
    fn take_gpu(&mut self, who: RequestId, reserve: u32) -> Option<u32> {
        if self.gpu_free_len == 0 && !self.evict_gpu(who, reserve) {
            return None;
        }
        self.gpu_free_len -= 1;
        Some(self.gpu_free[self.gpu_free_len as usize])
    }

    /// Grows an active row to `capacity` tokens (a claimed one reloads its claims first); all-or-nothing.
    pub(super) fn grow(&mut self, slot: usize, capacity: u32, who: RequestId) -> bool {
        let s = self.seqs[slot];
        if s.state == SeqState::Claimed {
            let need = blocks_for(capacity, self.cfg.tokens_per_block).max(s.blocks);
            if need > self.cfg.max_blocks || !self.resume_row(slot, who, need - s.blocks) {
                return false;
            }
        }
        if capacity <= s.capacity {
            return true;
        }
        let tpb = self.cfg.tokens_per_block;
        // The pages it holds cover the growth (the common decode step): no division, no page.
        if capacity <= s.blocks.saturating_mul(tpb) {
            self.seqs[slot].capacity = capacity;
            return true;
        }
        let need = blocks_for(capacity, tpb);
        let new = need.saturating_sub(s.blocks);
        if need > self.cfg.max_blocks || new > self.gpu_available() {
            return false;
        }
        // Evictions first, so that the free stack holds the pages; then one copy off its top.
        while self.gpu_free_len < new {
            assert!(self.evict_gpu(who, 0), "the pages were counted available");
        }
        self.take_free(slot, new);
        self.seqs[slot].capacity = capacity;
        true
    }

    /// Appends `new` pages off the top of the GPU free stack, which holds them, to the row: one copy,
    /// and the prefix cache learns that they are private.
    #[inline(always)]
    pub(super) fn take_free(&mut self, slot: usize, new: u32) {
        debug_assert!(
            self.gpu_free_len >= new,
            "the caller counted the free pages"
        );
        let blocks = self.seqs[slot].blocks;
        let (top, at) = (self.gpu_free_len as usize, self.row(slot) + blocks as usize);
        for k in 0..new as usize {
            let page = self.gpu_free[top - 1 - k];
            self.tables[at + k] = page;
            if let Some(prefix) = self.prefix.as_mut() {
                prefix.take_private(page);
            }
        }
        self.gpu_free_len -= new;
        self.seqs[slot].blocks = blocks + new;
    }

    /// Releases the row's pages from `from_block` on, deepest first (so the deepest cached block becomes
    /// the oldest evictable one): a page nobody else holds and no cache keeps goes back to its free stack.
    pub(super) fn release_from(&mut self, slot: usize, from_block: u32) {
        let s = self.seqs[slot];
        let base = self.row(slot);
        for b in (from_block.max(s.released)..s.blocks).rev() {
            let e = self.tables[base + b as usize];
            let free = self.prefix.as_mut().is_none_or(|p| p.release(e));
            if free {
                self.push_free(e);
            }
        }
        let kept = from_block.min(s.blocks);
        self.seqs[slot].blocks = kept;
        self.seqs[slot].released = s.released.min(kept);
        if s.committed > kept {
            let chain = self.chain_to(slot, kept);
            self.seqs[slot].committed = kept;
            self.seqs[slot].chain = chain;
        }
    }

    /// A sliding window's release: the row's blocks wholly before position `keep_from` are given up,
    /// oldest first (a committed one stays in the prefix cache as an idle block, another page goes back
    /// to its free stack) and their entries become [`NO_PAGE`]. Nothing moves; nothing is logged.
    pub(super) fn release_window_row(&mut self, slot: usize, keep_from: u32) {
        let s = self.seqs[slot];
        let upto = (keep_from / self.cfg.tokens_per_block).min(s.blocks);
        if upto <= s.released {
            return;
        }
        let base = self.row(slot);
        for b in s.released..upto {
            let e = self.tables[base + b as usize];
            if self.prefix.as_mut().is_none_or(|p| p.release(e)) {
                self.push_free(e);
            }
            self.tables[base + b as usize] = NO_PAGE;
        }
        self.seqs[slot].released = upto;
    }

    /// The key of block `k - 1` of the slot's prompt (its root for `k == 0`), chained on from the
    /// deepest key the slot knows at or before it (its root, its last committed block, its memo's
    /// frontiers): a continuation's next block costs one hash, not one a block before it.
    pub(super) fn chain_to(&self, slot: usize, k: u32) -> u64 {
        let s = self.seqs[slot];
        let n = k.min(s.hashed);
        let (from, key) = self.anchor(slot, n);
        let base = self.row(slot);
        self.hashes[base + from as usize..base + n as usize]
            .iter()
            .fold(key, |key, &h| chain(key, h))
    }

    /// Suspends an active row: its private pages move to the host tier when it can take them all (and
    /// the log can record them), else everything stays HELD on the GPU; shared pages always stay.
    pub(super) fn suspend_row(&mut self, slot: usize, who: RequestId) {
        let s = self.seqs[slot];
        self.stats.suspends += 1;
        self.seqs[slot].state = SeqState::Suspended;
        self.seqs[slot].last_grow = 0;
        let live = s.blocks - s.released;
        if live == 0 {
            return;
        }
        let base = self.row(slot) + s.released as usize;
        let n = live as usize;
        let Some(prefix) = self.prefix.as_ref() else {
            if live > self.host_free_len || !self.log_room(live) {
                self.stats.held_suspends += 1;
                return;
            }
            let (h, g, m) = (
                self.host_free_len as usize - n,
                self.gpu_free_len as usize,
                self.moves_len,
            );
            move_pages::<true>(
                &mut self.tables[base..base + n],
                &self.host_free[h..h + n],
                &mut self.gpu_free[g..g + n],
                &mut self.moves[m..m + n],
                who,
            );
            self.host_free_len -= live;
            self.gpu_free_len += live;
            self.moves_len += n;
            self.stats.pages_offloaded += u64::from(live);
            return;
        };
        let row = &self.tables[base..base + n];
        let private = u32_of(
            row.iter()
                .filter(|&&e| e & HOST == 0 && prefix.private(e))
                .count(),
        );
        if private == 0 || private > self.host_available() || !self.log_room(private) {
            self.stats.held_suspends += 1;
            return;
        }
        for b in 0..n {
            let e = self.tables[base + b];
            let moves = e & HOST == 0 && self.prefix.as_ref().is_some_and(|p| p.private(e));
            if !moves {
                continue;
            }
            let Some(h) = self.take_host() else {
                panic!("the host pages were counted available");
            };
            self.log(who, Tier::Gpu, e, h);
            if let Some(prefix) = self.prefix.as_mut() {
                prefix.move_private(e, h | HOST);
            }
            self.push_free(e);
            self.tables[base + b] = h | HOST;
        }
    }

    /// Brings a suspended or claimed row's host entries up to the GPU, with `extra` more GPU pages
    /// needed right after; all-or-nothing. A private page moves; a claimed cached block is reloaded (its
    /// index entry follows).
    pub(super) fn resume_row(&mut self, slot: usize, who: RequestId, extra: u32) -> bool {
        let s = self.seqs[slot];
        debug_assert!(matches!(s.state, SeqState::Suspended | SeqState::Claimed));
        let live = s.blocks - s.released;
        let base = self.row(slot) + s.released as usize;
        let n = live as usize;
        let row = &self.tables[base..base + n];
        let down = match (&self.prefix, row.first()) {
            // Without a prefix cache a row is all on one tier.
            (None, Some(&e)) if e & HOST != 0 => live,
            (None, _) => 0,
            (Some(_), _) => u32_of(row.iter().filter(|&&e| e & HOST != 0).count()),
        };
        if down + extra > self.gpu_available() || !self.log_room(down) {
            return false;
        }
        if self.prefix.is_none() && down > 0 {
            // Idle adapters make room first (unified paging): the copy below takes the free stack's top.
            while self.gpu_free_len < down {
                assert!(self.evict_gpu(who, 0), "the pages were counted available");
            }
            // All or none of a row is on the host without a prefix cache.
            let (g, h, m) = (
                self.gpu_free_len as usize - n,
                self.host_free_len as usize,
                self.moves_len,
            );
            move_pages::<false>(
                &mut self.tables[base..base + n],
                &self.gpu_free[g..g + n],
                &mut self.host_free[h..h + n],
                &mut self.moves[m..m + n],
                who,
            );
            self.gpu_free_len -= live;
            self.host_free_len += live;
            self.moves_len += n;
            self.stats.pages_reloaded += u64::from(live);
        } else {
            let mut left = down;
            for b in 0..n {
                if self.tables[base + b] & HOST != 0 {
                    left -= 1;
                    self.bring_up(base + b, who, left);
                }
            }
        }
        self.seqs[slot].state = SeqState::Active;
        true
    }

    /// Copies the host page of table entry `at` up to a GPU page (counted available by the caller, with
    /// room in the log for this copy and `reserve` more).
    fn bring_up(&mut self, at: usize, who: RequestId, reserve: u32) {
        let e = self.tables[at];
        let Some(p) = self.take_gpu(who, reserve + 1) else {
            panic!("the GPU pages were counted available");
        };
        self.log(who, Tier::Host, e & !HOST, p);
        if let Some(prefix) = self.prefix.as_mut() {
            if prefix.info(e).cached() {
                prefix.relocate(e, p);
                prefix.stats.host_hits += 1;
            } else {
                prefix.move_private(e, p);
            }
        }
        self.push_free(e);
        self.tables[at] = p;
    }

    /// The slot loses its cache (its prompt's hashes and root stay, for a replay).
    pub(super) fn free_row(&mut self, slot: usize) {
        self.release_from(slot, 0);
        let s = self.seqs[slot];
        self.seqs[slot] = Seq {
            root: s.root,
            hashed: s.hashed,
            chain: s.root,
            memo: s.memo,
            ..Seq::default()
        };
    }
}
