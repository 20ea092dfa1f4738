//! The prefix cache's invariants, checked (`KvPool::check` and `KvPool::audit` call them): the
//! index, the counts and the LRU lists in O(pages + index), and the child counts with a count per
//! page.

use super::{Prefix, NIL};
use crate::narrow::u32_of;
use crate::storage::Buffers;

impl<B: Buffers> Prefix<B> {
    /// Invariants 2, 4 and 6 in O(pages + index): every cached page is indexed under its key, the index
    /// holds nothing else, the cached, idle and shared counts agree, each tier's LRU list holds exactly its
    /// leaves, and a GPU block's cached parent is on the GPU.
    pub(in crate::page_pool) fn check(&self) -> bool {
        let (mut cached, mut idle, mut listed) = ([0u32; 2], [0u32; 2], [0u32; 2]);
        let (mut shared, mut claims) = (0u64, 0u32);
        for (at, p) in self.pages.iter().enumerate() {
            let t = usize::from(u32_of(at) >= self.gpu_pages);
            shared += u64::from(p.refs.saturating_sub(1));
            claims += u32::from(t == 1 && p.cached && p.refs > 0);
            if p.cached {
                cached[t] += 1;
                if self.find(p.key) != Some(p.entry as usize)
                    || self.index[p.entry as usize] as usize != at + 1
                {
                    return false;
                }
                if t == 0
                    && self.window == 0
                    && self
                        .parent_at(p.parent)
                        .is_some_and(|q| u32_of(q) >= self.gpu_pages)
                {
                    return false;
                }
            } else if p.children != 0 || p.gpu_children != 0 || p.holds != 0 {
                return false;
            }
            idle[t] += u32::from(p.idle());
            if p.listed != self.leaf(at) {
                return false;
            }
            listed[t] += u32::from(p.listed);
        }
        let indexed = u32_of(self.index.iter().filter(|&&v| v != 0).count());
        let walk = |t: usize| {
            let (mut n, mut at) = (0u32, self.lru[t].head);
            while at != NIL && n <= u32_of(self.pages.len()) {
                let p = &self.pages[at as usize];
                if !p.listed || usize::from(at >= self.gpu_pages) != t {
                    return u32::MAX;
                }
                n += 1;
                at = p.next;
            }
            n
        };
        cached == self.cached
            && shared == u64::from(self.shared)
            && claims == self.claims
            && idle == self.idle
            && indexed == cached[0] + cached[1]
            && listed == [self.lru[0].len, self.lru[1].len]
            && walk(0) == listed[0]
            && walk(1) == listed[1]
    }

    /// The counts' consistency in O(1): per tier, the cached pages are among those in use, and the
    /// idle ones and the listed leaves among the cached.
    pub(in crate::page_pool) fn check_counts(&self) -> bool {
        (0..2).all(|t| {
            self.cached[t] <= self.used[t]
                && self.idle[t] <= self.cached[t]
                && self.lru[t].len <= self.cached[t]
        })
    }

    /// Invariant 3 with a count per page (`scratch`, one per page, overwritten): every cached page's
    /// `children` and `gpu_children` are the cached pages (on the GPU) whose parent is its key.
    pub(in crate::page_pool) fn audit_children(&self, scratch: &mut [u32]) -> bool {
        if self.window > 0 {
            return self
                .pages
                .iter()
                .all(|p| p.children == 0 && p.gpu_children == 0);
        }
        for gpu_only in [false, true] {
            scratch.fill(0);
            for (at, p) in self.pages.iter().enumerate() {
                let counted = p.cached && (!gpu_only || (u32_of(at)) < self.gpu_pages);
                if let Some(q) = self.parent_at(p.parent).filter(|_| counted) {
                    scratch[q] += 1;
                }
            }
            let agree = self.pages.iter().zip(scratch.iter()).all(|(p, &n)| {
                let want = if gpu_only { p.gpu_children } else { p.children };
                !p.cached || want == n
            });
            if !agree {
                return false;
            }
        }
        true
    }
}
