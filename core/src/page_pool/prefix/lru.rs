//! The prefix cache's least-recently-used lists: per tier, its leaves (idle cached blocks with no child on
//! the GPU, or none at all on the host tier), oldest first, threaded through the pages' entries; and the
//! counts (idle pages, children) that decide what is a leaf.

use super::{Prefix, NIL};
use crate::narrow::u32_of;
use crate::storage::Buffers;

/// A tier's list of evictable cached pages, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Lru {
    pub(super) head: u32,
    pub(super) tail: u32,
    pub(super) len: u32,
}

impl Lru {
    pub(super) const EMPTY: Lru = Lru {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

impl<B: Buffers> Prefix<B> {
    /// A leaf of its tier: idle, with no child on the GPU (a GPU page) or none at all (a host page);
    /// in a window's cache, which counts no children, any idle block.
    pub(super) fn leaf(&self, at: usize) -> bool {
        let p = &self.pages[at];
        let children = if (u32_of(at)) < self.gpu_pages {
            p.gpu_children
        } else {
            p.children
        };
        p.idle() && children == 0
    }

    /// Puts the page on its tier's LRU list (as the youngest) or takes it off, as it is a leaf or not.
    pub(super) fn relist(&mut self, at: usize) {
        let leaf = self.leaf(at);
        if leaf && !self.pages[at].listed {
            self.link(at);
        } else if !leaf && self.pages[at].listed {
            self.unlink(at);
        }
    }

    pub(super) fn link(&mut self, at: usize) {
        let t = usize::from(u32_of(at) >= self.gpu_pages);
        let tail = self.lru[t].tail;
        self.pages[at].since = self.tick();
        self.pages[at].prev = tail;
        self.pages[at].next = NIL;
        self.pages[at].listed = true;
        if tail == NIL {
            self.lru[t].head = u32_of(at);
        } else {
            self.pages[tail as usize].next = u32_of(at);
        }
        self.lru[t].tail = u32_of(at);
        self.lru[t].len += 1;
    }

    pub(super) fn unlink(&mut self, at: usize) {
        let t = usize::from(u32_of(at) >= self.gpu_pages);
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
        self.pages[at].listed = false;
        self.lru[t].len -= 1;
    }

    /// Counts the page in (`+1`) or out of (`-1`) its tier's idle pages, as it is idle.
    pub(super) fn count_idle(&mut self, at: usize, sign: i32) {
        if self.pages[at].idle() {
            let t = usize::from(u32_of(at) >= self.gpu_pages);
            self.idle[t] = self.idle[t].wrapping_add_signed(sign);
        }
    }

    /// The cached page of `parent`, if any.
    pub(super) fn parent_at(&self, parent: u64) -> Option<usize> {
        self.find(parent).map(|k| (self.index[k] - 1) as usize)
    }

    /// The page caching the parent of the block cached at `child` (none in a sliding window's cache,
    /// which keeps no child counts): its hint when the parent is still there, else looked up (and the
    /// hint set), so a demotion or an eviction seldom probes the index for its parent.
    pub(super) fn parent_of(&mut self, child: usize) -> Option<usize> {
        if self.window > 0 {
            return None;
        }
        let (parent, hint) = (self.pages[child].parent, self.pages[child].above);
        if let Some(p) = self.pages.get(hint as usize) {
            if p.cached && p.key == parent {
                return Some(hint as usize);
            }
        }
        let at = self.parent_at(parent)?;
        self.pages[child].above = u32_of(at);
        Some(at)
    }

    /// A cached child of the block at page `up` ([`Prefix::parent_of`]) appears (`+1`) or goes
    /// (`-1`), on the GPU or not.
    pub(super) fn adopt(&mut self, up: Option<usize>, gpu: bool, sign: i32) {
        if let Some(at) = up {
            let p = &mut self.pages[at];
            p.children = p.children.wrapping_add_signed(sign);
            if gpu {
                p.gpu_children = p.gpu_children.wrapping_add_signed(sign);
            }
            self.relist(at);
        }
    }
}
