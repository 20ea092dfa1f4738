//! A first chunk's trial admission: what [`KvBackend::prepare_context`] would reuse and whether the
//! [`KvBackend::resize_context`] after it would be refused, told without acquiring, claiming or
//! releasing a block (DESIGN: the pass at depth; difference 15 in docs/conformance-format.md).
//!
//! A waiting request's prompt chain is remembered per slot ([`Memo`]): how many of its leading blocks
//! the prefix cache indexes (its *depth*, either tier), the key of the deepest and of the next. With
//! leaf-first eviction no cached block outlives its parent, so the deepest still indexed proves the
//! whole chain and the next still absent proves that it did not grow: two lookups re-validate it; a
//! chain that lost its deepest block is matched again from its root, one that gained the next block
//! is extended from it. A match stops early only at a host block another row claimed; while no cached
//! host block is claimed (the cache counts them) the match is the depth, within the match limit.
//!
//! The refusal is exact: a lower bound of the pages the resize needs (every matched block on the GPU,
//! none of them idle) refuses in O(1), an upper bound accepts in O(1), and between the two the matched
//! blocks are looked at (host blocks to reload, idle GPU blocks the match would take off the
//! evictable count), read only.
//!
//! Only a full-attention pool with neither a KV connector (its offer is made by the preparation) nor
//! a sliding window (its hit is a window's) answers; others answer `None` and the pass prepares.
//!
//! [`KvBackend::prepare_context`]: crate::kv::KvBackend::prepare_context
//! [`KvBackend::resize_context`]: crate::kv::KvBackend::resize_context

use crate::kv::{chain, ContextPrep, Tier, TrialMark};
use crate::storage::Buffers;

use super::{blocks_for, KvPool, SeqState, HOST};

/// How far a property that holds for a prefix of a slot's chain reaches: how many leading blocks
/// have it, the key of the last of them (the root for none) and of the first without it. Two such
/// properties are remembered: *indexed* (the cache holds the block, either tier; prefix-closed since
/// eviction is leaf first) and *held* (a row references it; prefix-closed since a row holding a block
/// holds its parent).
#[derive(Debug, Clone, Copy, Default)]
struct Frontier {
    len: u32,
    last: u64,
    /// The key of block `len + 1` when the walk that set the frontier looked at it (an indexed
    /// frontier short of the slot's hashed blocks).
    first_without: u64,
    /// The stamps of the two keys the frontier stands on when it was set.
    watch: Watch,
}

/// Where the stamps of a frontier's two keys are kept (its last block's, and the next block's or
/// the last's again) and what they read when it was set: while both read the same, neither key was
/// indexed, dropped, first referenced or last released, so the frontier stands with no lookup.
#[derive(Debug, Clone, Copy, Default)]
struct Watch {
    at: [u32; 2],
    seen: [u32; 2],
}

/// A slot's remembered prompt chain (`trial.rs`): a cache of what the prefix cache says of it, not
/// state, so it is left out of equality and of the pool's fingerprint (two pools that differ only in
/// it behave alike).
#[derive(Debug, Clone, Copy, Default)]
pub struct Memo {
    /// Set since the slot's hashes were.
    known: bool,
    /// The prefix cache's version when it was set: unchanged, both frontiers stand.
    version: u64,
    indexed: Frontier,
    held: Frontier,
}

impl PartialEq for Memo {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Memo {}

impl core::hash::Hash for Memo {
    fn hash<H: core::hash::Hasher>(&self, _: &mut H) {}
}

impl<B: Buffers> KvPool<'_, B> {
    /// The block of `key` is indexed (and, for `held`, referenced by a row).
    fn has(&self, key: u64, held: bool) -> bool {
        self.prefix
            .as_ref()
            .is_some_and(|p| p.lookup(key).is_some_and(|e| !held || p.info(e).refs() > 0))
    }

    /// The frontier still stands within the slot's first `cap` blocks: its last block has the
    /// property and the next does not (two lookups).
    fn stands(&self, slot: usize, f: Frontier, held: bool, cap: u32) -> bool {
        f.len <= cap
            && (f.len == 0 || self.has(f.last, held))
            && (f.len == cap
                || !self.has(
                    chain(f.last, self.hashes[self.row(slot) + f.len as usize]),
                    held,
                ))
    }

    /// Walks the slot's chain on from `f` while its blocks have the property, within `cap` blocks.
    fn walk(&self, slot: usize, mut f: Frontier, held: bool, cap: u32) -> Frontier {
        let base = self.row(slot);
        while f.len < cap {
            f.first_without = chain(f.last, self.hashes[base + f.len as usize]);
            if !self.has(f.first_without, held) {
                break;
            }
            (f.last, f.len) = (f.first_without, f.len + 1);
        }
        f
    }

    /// The frontier as the cache stands now: the remembered one when it stands (the cache's version is
    /// the memo's, or its keys' stamps read as they did, or two lookups say so), extended when only
    /// blocks past it gained the property, searched for ([`KvPool::search`]) when it lost blocks,
    /// walked from the root for a slot with no memo.
    fn refreshed(&self, slot: usize, f: Frontier, held: bool, cap: u32) -> Frontier {
        if self.standing(slot, f, cap) {
            return f;
        }
        let found = self.found(slot, f, held, cap);
        self.stamped(slot, found)
    }

    /// [`KvPool::refreshed`] for a reader that keeps nothing: a frontier found anew is not stamped.
    fn current(&self, slot: usize, f: Frontier, held: bool, cap: u32) -> Frontier {
        if self.standing(slot, f, cap) {
            return f;
        }
        self.found(slot, f, held, cap)
    }

    /// The remembered frontier `f` stands in O(1): the cache's version is the memo's, or neither of
    /// its keys moved (within `cap` blocks).
    fn standing(&self, slot: usize, f: Frontier, cap: u32) -> bool {
        let memo = self.seqs[slot].memo;
        let current = self.prefix.as_ref().map(super::prefix::Prefix::version);
        memo.known && (current == Some(memo.version) || self.unmoved(f) && f.len <= cap)
    }

    /// Neither of the frontier's two keys moved since it was set (`Prefix::moved`).
    fn unmoved(&self, f: Frontier) -> bool {
        self.prefix.as_ref().is_some_and(|p| {
            let w = f.watch;
            w.seen == [p.stamp(w.at[0]), p.stamp(w.at[1])]
        })
    }

    /// The frontier with the stamps of its keys as they read now.
    fn stamped(&self, slot: usize, mut f: Frontier) -> Frontier {
        let Some(p) = self.prefix.as_ref() else {
            return f;
        };
        let next = if f.len < self.seqs[slot].hashed {
            chain(f.last, self.hashes[self.row(slot) + f.len as usize])
        } else {
            f.last
        };
        let at = [p.stamp_at(f.last), p.stamp_at(next)];
        f.watch = Watch {
            at,
            seen: [p.stamp(at[0]), p.stamp(at[1])],
        };
        f
    }

    /// [`KvPool::refreshed`] past its O(1) checks.
    fn found(&self, slot: usize, f: Frontier, held: bool, cap: u32) -> Frontier {
        if !self.seqs[slot].memo.known {
            return self.walk(slot, self.root_frontier(slot), held, cap);
        }
        if self.stands(slot, f, held, cap) {
            return f;
        }
        if f.len > cap {
            return self.search(slot, held, cap + 1);
        }
        if f.len > 0 && !self.has(f.last, held) {
            return self.search(slot, held, f.len);
        }
        // Only blocks past it gained the property: extend.
        self.walk(slot, f, held, cap)
    }

    /// No block of the slot's chain: its root.
    fn root_frontier(&self, slot: usize) -> Frontier {
        Frontier {
            last: self.seqs[slot].root,
            ..Frontier::default()
        }
    }

    /// The frontier of a property that block `fails` of the slot's chain lacks (so every later one
    /// does): lengths 1, 2, 4, … tried from the root, then bisected, so a chain that lost its deepest
    /// blocks costs a logarithmic number of lookups (and a hash a block), not a walk of its blocks.
    fn search(&self, slot: usize, held: bool, fails: u32) -> Frontier {
        let base = self.row(slot);
        let key_at = |(from, key): (u32, u64), to: u32| {
            (from..to).fold(key, |k, b| chain(k, self.hashes[base + b as usize]))
        };
        let (mut lo, mut hi) = ((0u32, self.seqs[slot].root), fails);
        let mut len = 1;
        while len < hi {
            let key = key_at(lo, len);
            if !self.has(key, held) {
                hi = len;
                break;
            }
            lo = (len, key);
            len *= 2;
        }
        while hi - lo.0 > 1 {
            let mid = lo.0 + (hi - lo.0) / 2;
            let key = key_at(lo, mid);
            if self.has(key, held) {
                lo = (mid, key);
            } else {
                hi = mid;
            }
        }
        let (len, last) = lo;
        let first_without = if len < self.seqs[slot].hashed {
            chain(last, self.hashes[base + len as usize])
        } else {
            0
        };
        Frontier {
            len,
            last,
            first_without,
            watch: Watch::default(),
        }
    }

    /// Side-effect free: the slot's indexed frontier now.
    fn indexed_now(&self, slot: usize) -> Frontier {
        let s = self.seqs[slot];
        self.refreshed(slot, s.memo.indexed, false, s.hashed)
    }

    /// The slot's chain depth (its indexed frontier) and held frontier, refreshed and remembered.
    fn remember(&mut self, slot: usize) -> Memo {
        let indexed = self.indexed_now(slot);
        let held = self.refreshed(slot, self.seqs[slot].memo.held, true, indexed.len);
        debug_assert!(
            {
                let root = self.root_frontier(slot);
                let walked = self.walk(slot, root, false, self.seqs[slot].hashed);
                walked.len == indexed.len && self.walk(slot, root, true, walked.len).len == held.len
            },
            "a remembered frontier is the one a walk from the root finds"
        );
        let memo = Memo {
            known: true,
            version: self
                .prefix
                .as_ref()
                .map_or(0, super::prefix::Prefix::version),
            indexed,
            held,
        };
        self.seqs[slot].memo = memo;
        memo
    }

    /// The deepest block count at or before `n` whose chain key the slot knows, and that key: its root,
    /// its committed blocks' chain, its memo's frontiers.
    pub(super) fn anchor(&self, slot: usize, n: u32) -> (u32, u64) {
        let s = self.seqs[slot];
        let mut best = (0, s.root);
        let mut known = [(s.committed, s.chain), (0, 0), (0, 0)];
        if s.memo.known {
            let (i, h) = (s.memo.indexed, s.memo.held);
            known[1] = (i.len, i.last);
            known[2] = (h.len, h.last);
        }
        for (len, key) in known {
            if len <= n && len > best.0 {
                best = (len, key);
            }
        }
        best
    }

    /// Side-effect free: the key of the first block of the slot's chain past its first `k` blocks, for
    /// `k` up to its depth (`None` past its hashed blocks), from the memo where it can.
    pub(super) fn key_after(&self, slot: usize, limit: u32) -> Option<u64> {
        let s = self.seqs[slot];
        let f = self.current(slot, s.memo.indexed, false, s.hashed);
        match f.len.min(limit) {
            k if k >= self.seqs[slot].hashed => None,
            k if k == f.len => Some(f.first_without),
            k if k + 1 == f.len => Some(f.last),
            k => Some(self.chain_to(slot, k + 1)),
        }
    }

    /// A fresh first chunk the trial can answer for.
    fn trial_slot(&self, slot: usize, prep: ContextPrep) -> bool {
        prep.first_chunk
            && self.seqs[slot].state == SeqState::None
            && self.connector.is_none()
            && self.prefix.as_ref().is_none_or(|p| p.window() == 0)
    }

    /// The tokens `prepare_context` would reuse for this first chunk now, without preparing it; `None`
    /// where the trial does not answer (the module's doc).
    pub(super) fn trial_reuse(&mut self, slot: usize, prep: ContextPrep) -> Option<u32> {
        if !self.trial_slot(slot, prep) {
            return None;
        }
        let Some(prefix) = self.prefix.as_ref() else {
            return Some(0);
        };
        // Granted whatever it reuses: every block of the prompt and its drafts fits beside the pool's
        // holders (a match takes at most a page for each block it does not add). The pass prepares
        // as usual, with no trial to pay for a request that is admitted.
        let most = blocks_for(
            prep.prompt.saturating_add(prep.lookahead),
            self.cfg.tokens_per_block,
        );
        if most <= self.cfg.max_blocks && most <= self.gpu_available() && self.log_room(most) {
            return None;
        }
        if prefix.claims() > 0 {
            // A claimed host block can stop the match short of the depth: the walk says where.
            return Some(self.probe_reuse(slot, prep));
        }
        let depth = self.remember(slot).indexed.len;
        Some(depth.min(self.match_limit(slot, prep)) * self.cfg.tokens_per_block)
    }

    /// Side-effect free, right after [`KvPool::trial_reuse`] told `reused` tokens: whether the resize
    /// to `capacity` after the match would be refused, and by how many pages at least
    /// ([`crate::kv::PrefixReuse::trial_refused`]). A match of `m` blocks takes one available GPU page
    /// for each it does not find held by a row (an idle GPU block leaves the evictable count, a host
    /// block is reloaded; with no claimed host block, held blocks are a prefix of the GPU ones).
    pub(super) fn trial_refused(
        &self,
        slot: usize,
        prep: ContextPrep,
        reused: u32,
        capacity: u32,
    ) -> Option<u32> {
        if !self.trial_slot(slot, prep) {
            return None;
        }
        let m = reused / self.cfg.tokens_per_block;
        let need = blocks_for(capacity, self.cfg.tokens_per_block).max(m);
        let (new, avail) = (need - m, self.gpu_available());
        if need > self.cfg.max_blocks {
            return Some(u32::MAX);
        }
        let short = |want: u32| (want > avail).then(|| want - avail);
        if new > avail {
            return short(new);
        }
        let claimed = self.prefix.as_ref().is_some_and(|p| p.claims() > 0);
        if claimed || !self.log_room(m) {
            let (host, idle) = self.matched_tiers(slot, m);
            if host > 0 && !self.log_room(host) {
                return Some(0);
            }
            return short(host + idle + new);
        }
        let memo = self.seqs[slot].memo;
        let unheld = m - memo.held.len.min(m);
        debug_assert!(
            self.stands(slot, memo.held, true, memo.indexed.len),
            "the held frontier stands"
        );
        debug_assert_eq!(
            unheld,
            {
                let (host, idle) = self.matched_tiers(slot, m);
                host + idle
            },
            "the held frontier counts the blocks a match takes from the available pages (m {m}, held {}, indexed {})", memo.held.len, memo.indexed.len
        );
        short(unheld + new)
    }

    /// What a refused trial read of the pool: the prefix cache's version, the GPU pages available and
    /// the tokens a page holds (`None` where the trial does not answer, and while a cached host block is claimed: a match
    /// may then stop short of its chain's depth, which no memo says).
    pub(super) fn trial_mark(&self) -> Option<TrialMark> {
        let prefix = self.prefix.as_ref()?;
        let answers = self.connector.is_none() && prefix.window() == 0 && prefix.claims() == 0;
        answers.then(|| TrialMark {
            version: prefix.version(),
            available: self.gpu_available(),
            block: self.cfg.tokens_per_block,
        })
    }

    /// The slot's last trial, under a mark (so with no claimed host block: its memo was set then),
    /// would read the same frontiers now: none is claimed now either and neither frontier's keys
    /// moved.
    pub(super) fn trial_unmoved(&self, slot: usize) -> bool {
        let m = self.seqs[slot].memo;
        self.trial_mark().is_some()
            && m.known
            && self.seqs[slot].state == SeqState::None
            && self.unmoved(m.indexed)
            && self.unmoved(m.held)
    }

    /// Of the first `m` blocks of the slot's chain (all indexed): those on the host tier (a match
    /// claims them, the resize reloads them) and the idle ones on the GPU (a match takes them off the
    /// evictable count).
    fn matched_tiers(&self, slot: usize, m: u32) -> (u32, u32) {
        let Some(prefix) = self.prefix.as_ref() else {
            return (0, 0);
        };
        let (mut key, base) = (self.seqs[slot].root, self.row(slot));
        let (mut host, mut idle) = (0, 0);
        for k in 0..m as usize {
            key = chain(key, self.hashes[base + k]);
            let Some(e) = prefix.lookup(key) else {
                panic!("a matched block is indexed");
            };
            let p = prefix.info(e);
            if e & HOST != 0 {
                host += 1;
            } else if p.refs() == 0 && p.holds() == 0 {
                idle += 1;
            }
        }
        debug_assert!(idle <= prefix.evictable(Tier::Gpu));
        (host, idle)
    }
}
