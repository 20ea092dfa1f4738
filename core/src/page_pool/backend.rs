//! The pool as the scheduler's [`KvBackend`]: no draft or cross pool of its own (a
//! [`crate::kv_set::KvSet`] pairs pools), and the capabilities it is configured with — a prefix cache
//! ([`PrefixReuse`]), a KV connector ([`Transfers`]), unified adapter paging ([`AdapterPaging`]) — as
//! itself. It can be paired in a set ([`PairedPool`]).

use crate::kv::{
    Absent, AdapterPaging, AdaptersCap, CacheState, ContextPrep, KvBackend, KvLimits, KvRef,
    LoadChange, PageMove, PairedPool, PrefixCap, PrefixReuse, Reach, Transfers, TransfersCap,
    TrialMark,
};

use super::{blocks_for, KvPool, Seq, SeqState};
use crate::ids::{RequestId, TaskSlot};
use crate::narrow::u32_of;
use crate::storage::Buffers;

impl<B: Buffers> KvPool<'_, B> {
    /// A decode step across a page boundary of an active cache, with a free page at hand: the page off
    /// the free stack, no eviction, no division.
    #[inline(never)]
    fn grow_one_page(&mut self, slot: usize, target: u32, grow: u32) -> bool {
        self.take_free(slot, 1);
        let seq = &mut self.seqs[slot];
        seq.capacity = target;
        seq.last_grow = grow;
        true
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
            SeqState::Active | SeqState::Claimed => {
                if !self.grow(i, target, r.id) {
                    return false;
                }
            }
            SeqState::Suspended => {
                let extra = blocks_for(target, self.cfg.tokens_per_block).saturating_sub(s.blocks);
                if blocks_for(target, self.cfg.tokens_per_block) > self.cfg.max_blocks
                    || !self.resume_row(i, r.id, extra)
                {
                    return false;
                }
                let grown = self.grow(i, target, r.id);
                debug_assert!(grown, "resume reserved the growth");
            }
        }
        self.seqs[i].last_grow = grow;
        true
    }
}

impl<B: Buffers> KvBackend for KvPool<'_, B> {
    type Draft = Absent;
    type Cross = Absent;
    type Transfers = Self;
    type Prefix = Self;
    type Adapters = Self;

    fn limits(&self) -> KvLimits {
        KvLimits {
            tier_below_gpu: self.cfg.host_pages > 0,
            can_evict: self.cfg.host_pages > 0,
            max_tokens_per_request: u64::from(self.cfg.max_blocks.min(self.cfg.gpu_pages))
                * u64::from(self.cfg.tokens_per_block),
            slots: self.cfg.slots,
            sliding_windows: false,
            reserves: false,
        }
    }

    #[inline]
    fn cache(&self, r: KvRef) -> CacheState {
        match self.slot(r).map(|i| self.seqs[i].state) {
            None | Some(SeqState::None) => CacheState::NoCache,
            Some(SeqState::Suspended) => CacheState::Inactive,
            Some(SeqState::Active | SeqState::Claimed) => CacheState::Active,
        }
    }

    fn prepare_context(&mut self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        let i = self.slot(r)?;
        match self.seqs[i].state {
            SeqState::None if prep.first_chunk => {
                self.seqs[i].state = SeqState::Active;
                let reused = self.match_prefix(i, prep);
                if self.connector.is_none() {
                    return Some(reused);
                }
                // The connector's offer past the pool's own match counts as reused (spec AA1).
                let tpb = self.cfg.tokens_per_block;
                let limit = self.match_limit(i, prep);
                let offered = self.connector_offer(r, i, reused / tpb, limit);
                Some(reused + offered * tpb)
            }
            SeqState::None => None,
            SeqState::Active | SeqState::Claimed => Some(0),
            SeqState::Suspended => self.resume_row(i, r.id, 0).then_some(0),
        }
    }

    fn resize_context(&mut self, r: KvRef, capacity: u32, first_chunk: bool) -> bool {
        let Some(i) = self.slot(r) else { return false };
        if !matches!(self.seqs[i].state, SeqState::Active | SeqState::Claimed) {
            return false;
        }
        let before = self.seqs[i].capacity;
        if self.grow(i, capacity, r.id) {
            self.seqs[i].last_grow = self.seqs[i].capacity - before;
            if first_chunk && self.connector.is_some() {
                self.connector_start(r, i);
            }
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
        let slot = r.slot as usize;
        if let Some(s) = self.seqs.get_mut(slot) {
            if s.state == SeqState::Active {
                let Some(target) = s.capacity.checked_add(grow) else {
                    return false;
                };
                let held = u64::from(s.blocks) * u64::from(tpb);
                if u64::from(target) <= held {
                    // target >= capacity: the checked sum did not overflow.
                    s.capacity = target;
                    s.last_grow = grow;
                    return true;
                }
                if s.blocks >= max_blocks || (free == 0 && self.gpu_available() == 0) {
                    return false;
                }
                if free > 0 && u64::from(target) <= held + u64::from(tpb) {
                    return self.grow_one_page(slot, target, grow);
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
        self.release_from(i, blocks_for(cap, self.cfg.tokens_per_block));
    }

    fn suspend(&mut self, r: KvRef) {
        let Some(i) = self.slot(r) else { return };
        if matches!(self.seqs[i].state, SeqState::Active | SeqState::Claimed) {
            self.suspend_row(i, r.id);
        }
    }

    fn free(&mut self, r: KvRef) {
        let Some(i) = self.slot(r) else { return };
        if self.connector.is_some() {
            self.connector_drop(r, i);
        }
        if self.seqs[i].state != SeqState::None {
            self.free_row(i);
        }
    }

    fn preempt(&mut self, r: KvRef) {
        self.free(r);
    }

    fn prepare_disagg_gen_init(&mut self, r: KvRef, capacity: u32) -> bool {
        let Some(i) = self.slot(r) else { return false };
        match self.seqs[i].state {
            SeqState::None => {
                self.seqs[i].state = SeqState::Active;
                if self.grow(i, capacity, r.id) {
                    true
                } else {
                    let s = self.seqs[i];
                    self.seqs[i] = Seq {
                        state: SeqState::None,
                        ..s
                    };
                    false
                }
            }
            SeqState::Active | SeqState::Claimed => self.grow(i, capacity, r.id),
            SeqState::Suspended => {
                let extra = blocks_for(capacity, self.cfg.tokens_per_block)
                    .saturating_sub(self.seqs[i].blocks);
                self.resume_row(i, r.id, extra) && self.grow(i, capacity, r.id)
            }
        }
    }

    fn take_moves(&mut self) -> &[PageMove] {
        let n = core::mem::take(&mut self.moves_len);
        &self.moves[..n]
    }

    fn rewind(&mut self, r: KvRef, tokens: u32) {
        let Some(i) = self.slot(r) else { return };
        let s = self.seqs[i];
        if s.state != SeqState::Active {
            return;
        }
        let cap = s.capacity.saturating_sub(tokens);
        self.seqs[i].capacity = cap;
        self.seqs[i].last_grow = 0;
        self.release_from(
            i,
            blocks_for(cap, self.cfg.tokens_per_block).max(s.committed),
        );
    }
}

/// The pool is its own connector, prefix cache and adapter pager, each while configured.
macro_rules! reach_self {
    ($cap:ty, $field:ident) => {
        impl<'a, B: Buffers> Reach<KvPool<'a, B>, $cap> for KvPool<'a, B> {
            #[inline]
            fn reach(k: &Self) -> Option<&Self> {
                k.$field.is_some().then_some(k)
            }
            #[inline]
            fn reach_mut(k: &mut Self) -> Option<&mut Self> {
                if k.$field.is_some() {
                    Some(k)
                } else {
                    None
                }
            }
        }
    };
}

reach_self!(TransfersCap, connector);
reach_self!(PrefixCap, prefix);
reach_self!(AdaptersCap, adapters);

impl<B: Buffers> PairedPool for KvPool<'_, B> {
    fn revert_allocate_context(&mut self, r: KvRef) -> bool {
        // The growth of the last resize is undone like a generation step's, then the cache suspended.
        self.revert_allocate_generation(r);
        self.suspend(r);
        true
    }

    fn admit_mirror(&mut self, r: KvRef) -> bool {
        let Some(i) = self.slot(r) else { return false };
        match self.seqs[i].state {
            SeqState::None => {
                self.seqs[i].state = SeqState::Active;
                true
            }
            SeqState::Active | SeqState::Claimed => true,
            SeqState::Suspended => self.resume_row(i, r.id, 0),
        }
    }

    fn resume_blocked(&self, r: KvRef) -> bool {
        self.slot(r).is_some_and(|i| {
            let s = self.seqs[i];
            let down = u32_of(
                self.row_entries(i, &s)
                    .iter()
                    .filter(|&&e| e & super::HOST != 0)
                    .count(),
            );
            s.state == SeqState::Suspended && (down > self.gpu_available() || !self.log_room(down))
        })
    }
}

/// The prefix cache (present while the pool has one).
impl<B: Buffers> PrefixReuse for KvPool<'_, B> {
    fn set_prefix(&mut self, r: KvRef, root: u64, hashes: &[u64]) {
        if let Some(i) = self.slot(r) {
            if self.seqs[i].state == SeqState::None {
                self.set_prefix_row(i, root, hashes);
                self.connector_new_request(i);
            }
        }
    }

    fn commit(&mut self, r: KvRef, computed: u32) {
        if let Some(i) = self.slot(r) {
            if self.seqs[i].state == SeqState::Active {
                let computed = self.connector_commit_limit(i, computed);
                self.commit_row(i, computed);
                if self.connector.is_some() {
                    self.connector_save(r, i);
                }
            }
        }
    }

    fn all_blocks_reusable(&self) -> bool {
        self.prefix.is_some()
    }

    fn can_fork(&self, parent: KvRef, child: KvRef, tokens: u32) -> Option<u32> {
        let (p, c) = (self.slot(parent)?, self.slot(child)?);
        Some(self.fork_blocks(p, c, tokens)? * self.cfg.tokens_per_block)
    }

    fn fork(&mut self, parent: KvRef, child: KvRef, tokens: u32) -> Option<u32> {
        let (p, c) = (self.slot(parent)?, self.slot(child)?);
        self.fork_row(p, c, tokens)
    }

    fn drop_idle_blocks(&mut self) -> u32 {
        self.drop_idle()
    }

    fn probe_first_new_block(&self, r: KvRef, prep: ContextPrep) -> Option<u64> {
        self.probe_row(self.slot(r)?, prep)
    }

    fn probe_context_reuse(&self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        Some(self.probe_reuse(self.slot(r)?, prep))
    }

    fn trial_reuse(&mut self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        KvPool::trial_reuse(self, self.slot(r)?, prep)
    }

    fn trial_refused(
        &self,
        r: KvRef,
        prep: ContextPrep,
        reused: u32,
        capacity: u32,
    ) -> Option<u32> {
        KvPool::trial_refused(self, self.slot(r)?, prep, reused, capacity)
    }

    fn trial_mark(&self) -> Option<TrialMark> {
        KvPool::trial_mark(self)
    }

    fn trial_unmoved(&self, r: KvRef) -> bool {
        self.slot(r).is_some_and(|i| KvPool::trial_unmoved(self, i))
    }
    fn take_kv_events(&mut self) -> &[crate::kv_events::KvEvent] {
        KvPool::take_kv_events(self)
    }
}

/// The KV connector (present while one is attached; the pool has no transfer manager of its own).
impl<B: Buffers> Transfers for KvPool<'_, B> {
    fn take_load_changes(&mut self, f: &mut dyn FnMut(u16, LoadChange)) {
        self.connector_changes(f);
    }

    fn sends_in_flight(&self) -> bool {
        false
    }
}

/// Unified adapter paging (present while it is on: [`KvPool::page_adapters`]).
impl<B: Buffers> AdapterPaging for KvPool<'_, B> {
    fn max_tokens_beside_adapter(&self, pages: u32) -> u64 {
        if self.adapters.is_none() {
            return self.limits().max_tokens_per_request;
        }
        let room = self.cfg.gpu_pages.saturating_sub(pages);
        u64::from(self.cfg.max_blocks.min(room)) * u64::from(self.cfg.tokens_per_block)
    }

    fn can_pin_adapter(&self, task: TaskSlot, pages: u32) -> bool {
        self.adapters.is_none() || self.can_pin(task, pages)
    }

    #[inline]
    fn pin_adapter(&mut self, who: RequestId, task: TaskSlot, pages: u32) -> bool {
        self.adapters.is_none() || self.pin(who, task, pages)
    }

    #[inline]
    fn unpin_adapter(&mut self, task: TaskSlot) {
        if self.adapters.is_some() {
            self.unpin(task);
        }
    }

    fn drop_adapter(&mut self, task: TaskSlot) {
        self.drop_adapter_copy(task);
    }

    fn adapter_pins(&self, task: TaskSlot) -> Option<u32> {
        self.adapter(task).map(|a| a.pins())
    }

    fn take_adapter_placements(&mut self, f: &mut dyn FnMut(TaskSlot)) {
        KvPool::take_adapter_placements(self, f);
    }

    fn take_adapter_evictions(&mut self, f: &mut dyn FnMut(TaskSlot)) {
        KvPool::take_adapter_evictions(self, f);
    }
}
