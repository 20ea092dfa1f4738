//! Unified paging (beyond the reference; S-LoRA, Sheng et al., MLSys 2024): the adapters' device copies
//! live in the pool's GPU pages, beside the KV, instead of in a device cache of their own.
//!
//! An adapter of `pages` pages is placed on pages taken like a KV page (off the free stack, evicting
//! what is evictable), chained through `links`, so the binding can write its weights at those pages'
//! offsets in the one device allocation. Every lease on the adapter *pins* it (the scheduler pins also
//! while it finds KV for a request that will take a lease); a pinned adapter is never evicted. An
//! adapter nobody pins is *idle*: it stays resident, and the pool evicts it when it needs pages, by the
//! same rule as the idle cached KV blocks — what became evictable first goes first (one clock stamps
//! both; a cached block becomes evictable when it is a leaf, an adapter when its last pin goes). A placement nobody pinned any more before the binding heard of it is dropped at once: its
//! weights were never copied.
//!
//! The binding learns what to copy and what to forget through [`KvPool::take_adapter_placements`]
//! (write the weights at [`KvPool::adapter_pages`]) and [`KvPool::take_adapter_evictions`] (its pages
//! are KV's again); the scheduler hands them over with `ensure_batch` and `take_adapter_evictions`.
//!
//! Invariants (checked by [`KvPool::check`] and [`KvPool::audit`]): the resident adapters' pages sum
//! to the pool's adapter pages, and the idle ones' to its idle adapter pages; every chain has its
//! adapter's length and names GPU pages that are neither free nor in a row, each in one chain.

use crate::ids::{RequestId, TaskSlot};
use crate::storage::{Borrowed, Buffers};

use super::KvPool;
use crate::narrow::u16_of;

/// No page (the end of a chain).
const NIL: u32 = u32::MAX;
/// A placement the binding has not heard of: its weights must be written.
const PLACED: u8 = 1;
/// An eviction the binding has not heard of: the copy it wrote is gone.
const EVICTED: u8 = 2;

/// One adapter slot's device copy in a unified pool (indexed by the adapter cache's task slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AdapterPages {
    head: u32,
    pages: u32,
    pins: u32,
    since: u64,
    log: u8,
}

impl Default for AdapterPages {
    fn default() -> Self {
        Self {
            head: NIL,
            pages: 0,
            pins: 0,
            since: 0,
            log: 0,
        }
    }
}

impl AdapterPages {
    /// The copy is on the device.
    pub fn resident(&self) -> bool {
        self.head != NIL
    }
    /// Pages it occupies (0 when not resident).
    pub fn pages(&self) -> u32 {
        if self.resident() {
            self.pages
        } else {
            0
        }
    }
    /// Leases and reservations pinning it.
    pub fn pins(&self) -> u32 {
        self.pins
    }
}

/// The buffers of unified paging. Lengths: `slots` = the adapter cache's task slots, `links` = the
/// pool's GPU pages.
#[derive(Debug)]
pub struct AdapterBuffers<B: Buffers> {
    /// One entry per adapter task slot.
    pub slots: B::Buf<AdapterPages>,
    /// The next page of a chain, by GPU page.
    pub links: B::Buf<u32>,
}

/// The borrowed buffers of unified paging.
pub type AdapterStorage<'a> = AdapterBuffers<Borrowed<'a>>;

/// The adapters' state in a unified pool.
#[derive(Debug)]
pub(super) struct Adapters<B: Buffers> {
    slots: B::Buf<AdapterPages>,
    links: B::Buf<u32>,
    /// Pages of resident adapters.
    pub(super) resident: u32,
    /// Placements and evictions, for the statistics.
    pub(super) placed: u64,
    pub(super) evicted: u64,
}

impl<B: Buffers> Adapters<B> {
    pub(super) fn new(mut s: AdapterBuffers<B>) -> Self {
        s.slots.fill(AdapterPages::default());
        s.links.fill(NIL);
        Self {
            slots: s.slots,
            links: s.links,
            resident: 0,
            placed: 0,
            evicted: 0,
        }
    }

    pub(super) fn slot(&self, task: TaskSlot) -> Option<&AdapterPages> {
        self.slots.get(usize::from(task))
    }

    /// The idle adapter that became idle first, with its stamp.
    pub(super) fn oldest_idle(&self) -> Option<(usize, u64)> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, a)| a.resident() && a.pins == 0)
            .min_by_key(|(_, a)| a.since)
            .map(|(i, a)| (i, a.since))
    }

    pub(super) fn hash_state<H: core::hash::Hasher>(&self, h: &mut H) {
        use core::hash::Hash;
        self.slots.hash(h);
        self.links.hash(h);
        self.resident.hash(h);
    }

    /// The chains agree with the counters (`idle`: the pool's idle adapter pages); `page` is called
    /// with every chained page.
    pub(super) fn check(
        &self,
        gpu_pages: u32,
        idle_pages: u32,
        mut page: impl FnMut(u32) -> bool,
    ) -> bool {
        let (mut resident, mut idle) = (0u32, 0u32);
        for a in self.slots.iter() {
            if !a.resident() {
                if a.pins != 0 {
                    return false;
                }
                continue;
            }
            let (mut n, mut p) = (0u32, a.head);
            while p != NIL && n <= a.pages {
                if p >= gpu_pages || !page(p) {
                    return false;
                }
                n += 1;
                p = self.links[p as usize];
            }
            if n != a.pages {
                return false;
            }
            resident += a.pages;
            if a.pins == 0 {
                idle += a.pages;
            }
        }
        resident == self.resident && idle == idle_pages
    }
}

impl<B: Buffers> KvPool<'_, B> {
    /// Turns on unified paging: adapters' device copies will share the GPU pages with the KV
    /// ([`crate::kv::AdapterPaging::pin_adapter`]). Refused, changing nothing, for buffers of the wrong
    /// length (`links` must have one entry per GPU page, `slots` at least one) or a pool that has
    /// given pages out already.
    pub fn page_adapters(&mut self, storage: AdapterBuffers<B>) -> Result<(), crate::Error> {
        if storage.links.len() != self.cfg.gpu_pages as usize
            || storage.slots.is_empty()
            || storage.slots.len() > usize::from(u16::MAX) + 1
        {
            return Err(crate::Error::Invalid(
                "adapter page buffers do not match the pool geometry",
            ));
        }
        if self.gpu_free_len != self.cfg.gpu_pages || self.adapters.is_some() {
            return Err(crate::Error::Invalid(
                "unified paging is turned on before the pool is used, once",
            ));
        }
        self.adapters = Some(Adapters::new(storage));
        Ok(())
    }
}

impl<B: Buffers> KvPool<'_, B> {
    /// The GPU pages of an adapter slot's device copy, in order (empty when it is not resident or the
    /// pool has no unified paging).
    pub fn adapter_pages(&self, task: TaskSlot) -> impl Iterator<Item = u32> + '_ {
        let (links, mut p): (&[u32], u32) = match &self.adapters {
            Some(a) => (&a.links, a.slot(task).map_or(NIL, |s| s.head)),
            None => (&[], NIL),
        };
        core::iter::from_fn(move || {
            let here = p;
            (here != NIL).then(|| {
                p = links[here as usize];
                here
            })
        })
    }

    /// An adapter slot's device copy (`None` without unified paging or for a slot beyond the storage).
    pub fn adapter(&self, task: TaskSlot) -> Option<AdapterPages> {
        self.adapters.as_ref()?.slot(task).copied()
    }

    /// GPU pages holding adapters, and of those the idle ones (evictable).
    pub fn adapter_usage(&self) -> (u32, u32) {
        self.adapters
            .as_ref()
            .map_or((0, 0), |a| (a.resident, self.adapter_idle))
    }

    /// Adapter placements and evictions so far.
    pub fn adapter_stats(&self) -> (u64, u64) {
        self.adapters
            .as_ref()
            .map_or((0, 0), |a| (a.placed, a.evicted))
    }

    /// A reading of the pool's one clock (the order in which cached blocks and adapters became idle):
    /// the prefix cache's, which stamps its blocks, when there is one.
    pub(super) fn stamp(&mut self) -> u64 {
        if let Some(p) = self.prefix.as_mut() {
            p.tick()
        } else {
            self.clock += 1;
            self.clock
        }
    }

    /// Whether pinning `task` (of `pages` pages) would succeed now.
    pub(super) fn can_pin(&self, task: TaskSlot, pages: u32) -> bool {
        match self.adapters.as_ref().and_then(|a| a.slot(task)) {
            None => false,
            Some(a) if a.resident() => true,
            Some(_) => pages <= self.gpu_available(),
        }
    }

    /// Pins `task`, placing its `pages` pages first when it is not resident (evicting for them as a
    /// KV allocation does, demotion copies logged as `who`'s). All-or-nothing.
    #[inline(never)]
    pub(super) fn pin(&mut self, who: RequestId, task: TaskSlot, pages: u32) -> bool {
        let t = usize::from(task);
        let Some(a) = self.adapters.as_ref().and_then(|a| a.slot(task)).copied() else {
            return false;
        };
        if a.resident() {
            if a.pins == 0 {
                self.adapter_idle -= a.pages;
            }
            let ad = self.adapters.as_mut().expect("unified");
            ad.slots[t].pins += 1;
            return true;
        }
        if pages == 0 || pages > self.gpu_available() {
            return false;
        }
        while self.gpu_free_len < pages {
            assert!(self.evict_gpu(who, 0), "the pages were counted available");
        }
        let mut head = NIL;
        for _ in 0..pages {
            self.gpu_free_len -= 1;
            let p = self.gpu_free[self.gpu_free_len as usize];
            let ad = self.adapters.as_mut().expect("unified");
            ad.links[p as usize] = head;
            head = p;
        }
        let ad = self.adapters.as_mut().expect("unified");
        let s = &mut ad.slots[t];
        s.head = head;
        s.pages = pages;
        s.pins = 1;
        s.log |= PLACED;
        ad.resident += pages;
        ad.placed += 1;
        true
    }

    /// Returns one pin of `task`. The last one leaves it idle (evictable), or drops a placement the
    /// binding never heard of.
    #[inline(never)]
    pub(super) fn unpin(&mut self, task: TaskSlot) {
        let t = usize::from(task);
        let Some(a) = self.adapters.as_ref().and_then(|a| a.slot(task)).copied() else {
            return;
        };
        assert!(a.resident() && a.pins > 0, "an unpinned adapter was pinned");
        let since = self.stamp();
        let ad = self.adapters.as_mut().expect("unified");
        ad.slots[t].pins -= 1;
        if a.pins > 1 {
            return;
        }
        ad.slots[t].since = since;
        self.adapter_idle += a.pages;
        if a.log & PLACED != 0 {
            self.evict_adapter(t);
        }
    }

    /// Drops an idle adapter's device copy (a reload replaced its weights); a pinned one is kept.
    pub(super) fn drop_adapter_copy(&mut self, task: TaskSlot) {
        if let Some(a) = self.adapters.as_ref().and_then(|a| a.slot(task)) {
            if a.resident() && a.pins == 0 {
                self.evict_adapter(usize::from(task));
            }
        }
    }

    /// Evicts idle adapter slot `t`: its pages go back on the free stack.
    pub(super) fn evict_adapter(&mut self, t: usize) {
        let Some(ad) = self.adapters.as_mut() else {
            return;
        };
        let a = ad.slots[t];
        assert!(
            a.resident() && a.pins == 0,
            "only an idle adapter is evicted"
        );
        let mut p = a.head;
        while p != NIL {
            let next = ad.links[p as usize];
            ad.links[p as usize] = NIL;
            self.gpu_free[self.gpu_free_len as usize] = p;
            self.gpu_free_len += 1;
            p = next;
        }
        let s = &mut ad.slots[t];
        s.head = NIL;
        // A placement the binding never heard of is forgotten; else it must drop its copy.
        if s.log & PLACED != 0 {
            s.log &= !PLACED;
        } else {
            s.log |= EVICTED;
            ad.evicted += 1;
        }
        ad.resident -= a.pages;
        self.adapter_idle -= a.pages;
    }

    /// Hands `f` every adapter slot placed since the last call (its weights must be written at
    /// [`KvPool::adapter_pages`]); those placements are then forgotten.
    pub fn take_adapter_placements(&mut self, f: &mut dyn FnMut(TaskSlot)) {
        self.take_adapter_bit(PLACED, f);
    }

    /// Hands `f` every adapter slot whose reported copy was evicted since the last call (its pages
    /// serve KV or another adapter now); those evictions are then forgotten. A slot evicted and placed
    /// again has both: the binding drops the old copy before it writes the new one.
    pub fn take_adapter_evictions(&mut self, f: &mut dyn FnMut(TaskSlot)) {
        self.take_adapter_bit(EVICTED, f);
    }

    fn take_adapter_bit(&mut self, bit: u8, f: &mut dyn FnMut(TaskSlot)) {
        let Some(ad) = self.adapters.as_mut() else {
            return;
        };
        for (t, s) in ad.slots.iter_mut().enumerate() {
            if s.log & bit != 0 {
                s.log &= !bit;
                f(TaskSlot(u16_of(t)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{AdapterPaging, ContextPrep, KvBackend, KvCaps, KvRef, PrefixReuse, Tier};
    use crate::page_pool::{KvPool, PageInfo};
    use crate::testing::{Mem, PrefixMem};

    /// 8 GPU pages, up to 8 host pages, 4 slots of 4 pages, 4 tokens a page.
    type Buf = Mem<8, 8, 4, 16, 16>;
    type Cache = PrefixMem<16, 32, 16>;
    const WHO: RequestId = RequestId(9);

    fn r(slot: u16) -> KvRef {
        KvRef {
            slot,
            id: RequestId(u64::from(slot) + 100),
        }
    }

    struct Region {
        slots: [AdapterPages; 4],
        links: [u32; 8],
    }

    impl Region {
        fn new() -> Self {
            Self {
                slots: [AdapterPages::default(); 4],
                links: [0; 8],
            }
        }
        fn storage(&mut self) -> AdapterStorage<'_> {
            AdapterStorage {
                slots: &mut self.slots,
                links: &mut self.links,
            }
        }
    }

    fn audited(p: &KvPool<'_>) -> bool {
        let mut scratch = [0u32; 16];
        p.audit(&mut scratch[..p.config().page_info_len()])
    }

    #[derive(Debug, PartialEq)]
    enum Placement {
        Evicted,
        Placed,
    }

    /// Both logs, evictions first.
    fn log(p: &mut KvPool<'_>) -> heapless::Vec<(TaskSlot, Placement), 8> {
        let mut out = heapless::Vec::new();
        p.take_adapter_evictions(&mut |t| out.push((t, Placement::Evicted)).unwrap());
        p.take_adapter_placements(&mut |t| out.push((t, Placement::Placed)).unwrap());
        out
    }

    /// A request of `tokens` tokens on slot `slot` gets its pages (or not).
    fn place(p: &mut KvPool<'_>, slot: u16, tokens: u32) -> bool {
        p.prepare_context(r(slot), ContextPrep::first(tokens))
            .is_some()
            && p.resize_context(r(slot), tokens, true)
    }

    #[test]
    fn an_adapter_takes_kv_pages_and_gives_them_back_when_kv_needs_them() {
        let (mut b, mut a) = (Buf::new(), Region::new());
        let mut p = b.pool(0, 4);
        p.page_adapters(a.storage()).unwrap();
        assert!(p.caps().adapters.is_some());
        assert!(p.pin_adapter(WHO, TaskSlot(1), 3));
        assert_eq!(p.gpu_free(), 5, "three pages went to the adapter");
        assert_eq!(p.adapter_pages(TaskSlot(1)).count(), 3);
        assert_eq!(log(&mut p), [(TaskSlot(1), Placement::Placed)]);
        assert!(audited(&p));
        // Pinned: beside a request of 4 pages, another cannot have its 4.
        assert!(place(&mut p, 0, 16));
        assert!(!p.can_pin_adapter(TaskSlot(2), 2));
        assert!(!place(&mut p, 1, 16));
        p.free(r(1));
        p.unpin_adapter(TaskSlot(1));
        assert_eq!(p.adapter_usage(), (3, 3), "idle, still resident");
        assert!(
            p.pin_adapter(WHO, TaskSlot(1), 3),
            "a resident adapter is pinned again"
        );
        assert_eq!(log(&mut p), [], "no second copy");
        p.unpin_adapter(TaskSlot(1));
        // Now the second request's pages evict the idle adapter.
        assert!(place(&mut p, 1, 16));
        assert_eq!(p.adapter_usage(), (0, 0));
        assert_eq!(p.gpu_free(), 0);
        assert_eq!(log(&mut p), [(TaskSlot(1), Placement::Evicted)]);
        assert!(audited(&p));
        // The adapter cannot come back beside the 8 pages, and trying changes nothing.
        let before = p.fingerprint();
        assert!(!p.pin_adapter(WHO, TaskSlot(1), 3));
        assert_eq!(p.fingerprint(), before);
    }

    #[test]
    fn a_placement_unpinned_before_the_binding_heard_of_it_is_dropped() {
        let (mut b, mut a) = (Buf::new(), Region::new());
        let mut p = b.pool(0, 4);
        p.page_adapters(a.storage()).unwrap();
        assert!(p.pin_adapter(WHO, TaskSlot(0), 2));
        p.unpin_adapter(TaskSlot(0));
        assert_eq!(p.gpu_free(), 8, "its pages are free again");
        assert_eq!(log(&mut p), [], "nothing to copy, nothing to drop");
        assert!(audited(&p));
    }

    #[test]
    fn cached_blocks_and_adapters_are_evicted_least_recently_idle_first() {
        let (mut b, mut c, mut a) = (Buf::new(), Cache::new(), Region::new());
        let mut p = b.pool_with(0, 4, Some(&mut c));
        p.page_adapters(a.storage()).unwrap();
        // Adapter 0 (2 pages) goes idle first, then two cached blocks, then adapter 1 (2 pages).
        assert!(p.pin_adapter(WHO, TaskSlot(0), 2));
        log(&mut p);
        p.unpin_adapter(TaskSlot(0));
        p.set_prefix(r(0), 7, &[1, 2]);
        assert!(place(&mut p, 0, 8));
        p.commit(r(0), 8);
        p.free(r(0));
        assert!(p.pin_adapter(WHO, TaskSlot(1), 2));
        log(&mut p);
        p.unpin_adapter(TaskSlot(1));
        assert_eq!((p.gpu_free(), p.idle_pages(Tier::Gpu)), (2, 2));
        assert!(audited(&p));
        // 3 pages: the 2 free ones, then adapter 0 (idle longest) — both its pages.
        assert!(place(&mut p, 1, 12));
        assert_eq!(log(&mut p), [(TaskSlot(0), Placement::Evicted)]);
        assert_eq!(p.idle_pages(Tier::Gpu), 2, "the cached blocks stay");
        // 3 more: the free one, the leaf block (idle before adapter 1), then adapter 1: the parent
        // block became evictable only when its child left, so it is the youngest.
        assert!(place(&mut p, 2, 12));
        assert_eq!(p.idle_pages(Tier::Gpu), 1);
        assert_eq!(log(&mut p), [(TaskSlot(1), Placement::Evicted)]);
        assert_eq!(p.gpu_free(), 1);
        assert!(audited(&p));
    }

    #[test]
    fn adapter_pages_are_neither_free_nor_cached() {
        let (mut b, mut c, mut a) = (Buf::new(), Cache::new(), Region::new());
        let mut p = b.pool_with(0, 4, Some(&mut c));
        p.page_adapters(a.storage()).unwrap();
        assert!(p.pin_adapter(WHO, TaskSlot(3), 4));
        for page in p.adapter_pages(TaskSlot(3)) {
            assert_eq!(p.page_info(page), Some(PageInfo::default()));
        }
        assert!(p.check() && audited(&p));
    }

    #[test]
    fn unified_paging_is_turned_on_once_on_an_unused_pool_with_matching_buffers() {
        let mut b = Buf::new();
        let [mut a, mut a2, mut a3, mut a4] = [(); 4].map(|()| Region::new());
        let mut p = b.pool(0, 4);
        let short = AdapterStorage {
            slots: &mut a.slots,
            links: &mut a.links[..7],
        };
        assert!(p.page_adapters(short).is_err());
        assert!(p.caps().adapters.is_none(), "a refusal changes nothing");
        assert!(place(&mut p, 0, 4));
        assert!(p.page_adapters(a2.storage()).is_err(), "the pool is in use");
        p.free(r(0));
        assert!(p.page_adapters(a3.storage()).is_ok());
        assert!(p.page_adapters(a4.storage()).is_err(), "once");
    }
}
