//! The pool's invariants, checked: [`KvPool::check`] (structural, O(pages + table entries)),
//! [`KvPool::audit`] (exact, with a count per page), and the spot checks a check mode runs after every
//! iteration in the time of what the iteration touched: [`KvPool::check_row`] (one row, O(its entries))
//! and [`KvPool::check_counts`] (the tiers' conservation, O(1)).

use super::{blocks_for, page_of, KvPool, PageInfo, Prefix, SeqState, HOST};
use crate::ids::TaskSlot;
use crate::kv::Tier;
use crate::narrow::u32_of;
use crate::storage::Buffers;

impl<B: Buffers> KvPool<'_, B> {
    /// The structural invariants, in O(pages + table entries) without scratch space: every row within
    /// its slot and naming pages that exist ([`KvPool::check_row`] for each); per tier, free pages +
    /// pages held by rows or cached = capacity; with a prefix cache, every free page unused, the
    /// references summing to the table entries, the pages in use as counted, and the cache's own
    /// invariants (`prefix.rs`). [`KvPool::audit`] adds what needs a count per page.
    pub fn check(&self) -> bool {
        let mut entries = [0u64; 2];
        for slot in 0..self.seqs.len() {
            let Some(n) = self.row_ok(slot, 0) else {
                return false;
            };
            entries[0] += n[0];
            entries[1] += n[1];
        }
        let (adapter_pages, _) = self.adapter_usage();
        let adapters_ok = self.adapters.as_ref().is_none_or(|a| {
            a.check(self.cfg.gpu_pages, self.adapter_idle, |p| {
                self.prefix
                    .as_ref()
                    .is_none_or(|x| *x.info(p) == PageInfo::default())
            })
        });
        adapters_ok
            && self.connector_check()
            && match &self.prefix {
                None => {
                    entries[0] + u64::from(self.gpu_free_len + adapter_pages)
                        == u64::from(self.cfg.gpu_pages)
                        && entries[1] + u64::from(self.host_free_len)
                            == u64::from(self.cfg.host_pages)
                }
                Some(prefix) => self.check_shared(prefix, entries[0] + entries[1]),
            }
    }

    /// One row's invariants, from block `from` on (a decode step touches its row's tail only): the row
    /// within its slot (its blocks cover its capacity), each entry naming a page that exists, on the
    /// host tier only when the row is not active; with a prefix cache each entry referenced, and a host
    /// entry the row's alone. O(the entries checked); `false` for a slot the pool does not have.
    pub fn check_row(&self, slot: u16, from: u32) -> bool {
        usize::from(slot) < self.seqs.len() && self.row_ok(usize::from(slot), from).is_some()
    }

    /// Conservation in O(1), from the counters: per tier, free pages + adapter pages + pages in use
    /// (referenced or cached, as the prefix cache counted them when they changed) = capacity, and the
    /// cache's own counts consistent (cached ≤ in use, idle and leaves ≤ cached). Without a prefix
    /// cache only the free stacks' bounds are known here: conservation is [`KvPool::check`]'s.
    pub fn check_counts(&self) -> bool {
        let (adapter_pages, _) = self.adapter_usage();
        let (gpu, host) = (self.cfg.gpu_pages, self.cfg.host_pages);
        let fits = u64::from(self.gpu_free_len) + u64::from(adapter_pages) <= u64::from(gpu)
            && self.host_free_len <= host;
        fits && self.prefix.as_ref().is_none_or(|p| {
            let used = p.used();
            used[0] + self.gpu_free_len + adapter_pages == gpu
                && used[1] + self.host_free_len == host
                && p.check_counts()
        })
    }

    /// [`KvPool::check_row`] of row `slot` from block `from`; the entries it holds per tier.
    fn row_ok(&self, slot: usize, from: u32) -> Option<[u64; 2]> {
        let s = &self.seqs[slot];
        if s.state == SeqState::None {
            return (s.blocks == 0).then_some([0; 2]);
        }
        if s.blocks > self.cfg.max_blocks
            || s.released > s.blocks
            || s.blocks < blocks_for(s.capacity, self.cfg.tokens_per_block)
        {
            return None;
        }
        let mut entries = [0u64; 2];
        let skip = from.saturating_sub(s.released) as usize;
        for &e in self.row_entries(slot, s).iter().skip(skip) {
            let (tier, page) = page_of(e);
            let host = tier == Tier::Host;
            if page >= self.tier_pages(tier) || (host && s.state == SeqState::Active) {
                return None;
            }
            // A host entry is the row's own: a private page, or a claimed cached block.
            let referenced = self.prefix.as_ref().is_none_or(|p| {
                let refs = p.info(e).refs();
                refs > 0 && (!host || refs == 1)
            });
            if !referenced {
                return None;
            }
            entries[usize::from(host)] += 1;
        }
        Some(entries)
    }

    /// [`KvPool::check`] with a prefix cache, given the number of table entries.
    fn check_shared(&self, prefix: &Prefix<B>, entries: u64) -> bool {
        let free = self.free_entries();
        for e in free {
            if *prefix.info(e) != PageInfo::default() {
                return false;
            }
        }
        let (used, refs) = prefix.usage();
        used[0] + self.gpu_free_len + self.adapter_usage().0 == self.cfg.gpu_pages
            && used[1] + self.host_free_len == self.cfg.host_pages
            && used == prefix.used()
            && refs == entries
            && prefix.check()
    }

    /// [`KvPool::check`], and exactly: every page is free once (no duplicate on a free stack), in one
    /// adapter's chain once, or held;
    /// a held page's reference count equals the number of table entries naming it (exactly one without
    /// a prefix cache), and one with none is a cached block; every cached block counts its cached
    /// children. `scratch` needs [`KvPoolConfig::page_info_len`](super::KvPoolConfig::page_info_len)
    /// entries (else `false`); O(pages + table entries).
    pub fn audit(&self, scratch: &mut [u32]) -> bool {
        const FREE: u32 = u32::MAX;
        if scratch.len() != self.cfg.page_info_len() || !self.check() {
            return false;
        }
        scratch.fill(0);
        let at = |e: u32| match page_of(e) {
            (Tier::Gpu, p) => p as usize,
            (Tier::Host, h) => (self.cfg.gpu_pages + h) as usize,
        };
        for (slot, s) in self.seqs.iter().enumerate() {
            for &e in self.row_entries(slot, s) {
                scratch[at(e)] += 1;
            }
        }
        let free = self.free_entries();
        for e in free {
            if scratch[at(e)] != 0 {
                return false;
            }
            scratch[at(e)] = FREE;
        }
        if self.adapters.is_some() {
            for t in 0..=u16::MAX {
                let Some(a) = self.adapter(TaskSlot(t)) else {
                    break;
                };
                for p in self.adapter_pages(TaskSlot(t)).take(a.pages() as usize) {
                    if scratch[p as usize] != 0 {
                        return false;
                    }
                    scratch[p as usize] = FREE;
                }
            }
        }
        for (i, &n) in scratch.iter().enumerate() {
            let entry = if u32_of(i) < self.cfg.gpu_pages {
                u32_of(i)
            } else {
                (u32_of(i) - self.cfg.gpu_pages) | HOST
            };
            let ok = match (&self.prefix, n) {
                (_, FREE) => true,
                (None, n) => n == 1,
                (Some(p), n) => {
                    let info = p.info(entry);
                    info.refs() == n && (n > 0 || info.cached())
                }
            };
            if !ok {
                return false;
            }
        }
        self.prefix
            .as_ref()
            .is_none_or(|p| p.audit_children(scratch))
    }

    /// Every free page as a table entry (host pages tagged), GPU stack first.
    fn free_entries(&self) -> impl Iterator<Item = u32> + '_ {
        self.gpu_free[..self.gpu_free_len as usize]
            .iter()
            .copied()
            .chain(
                self.host_free[..self.host_free_len as usize]
                    .iter()
                    .map(|&h| h | HOST),
            )
    }
}
