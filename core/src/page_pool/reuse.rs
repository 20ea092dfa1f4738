//! What the pool does with a row's prompt prefix: a first chunk's new row matched against the prefix
//! cache (a full pool's from the root; a sliding window's by its last window, `KvGroups`' rule), the
//! side-effect-free probes of the same, and a computed prefix committed.

use crate::kv::{chain, ContextPrep};
use crate::narrow::u32_of;
use crate::storage::Buffers;

use super::prefix::Prefix;
use super::{KvPool, Seq, SeqState, Tier, HOST, NO_PAGE};

impl<B: Buffers> KvPool<'_, B> {
    /// Makes the prefix cache a sliding window's, whose queries read `blocks` blocks before their own
    /// (`prefix.rs`: blocks evicted whatever their children; below: hits of the window's last
    /// blocks). `KvGroups` sets it on its window groups' pools; `false` (nothing changed) for a pool
    /// without a prefix cache or whose cache holds blocks.
    pub(crate) fn set_window(&mut self, blocks: u32) -> bool {
        match self.prefix.as_mut() {
            Some(p) if blocks > 0 && p.cached(Tier::Gpu) + p.cached(Tier::Host) == 0 => {
                p.set_window(blocks);
                true
            }
            _ => false,
        }
    }

    /// The pool has neither a KV connector nor unified adapter paging (what `KvGroups` requires).
    pub(crate) fn plain(&self) -> bool {
        self.connector.is_none() && self.adapters.is_none()
    }

    /// The key of block `k` of the slot's prompt (`None` past its hashed blocks).
    pub(crate) fn block_key(&self, slot: u16, k: u32) -> Option<u64> {
        let i = slot as usize;
        (i < self.seqs.len() && k < self.seqs[i].hashed).then(|| self.chain_to(i, k + 1))
    }

    /// A first chunk's new row matches its prompt's cached prefix, block by block from the root, up to
    /// the prompt minus its last token and the draft lookahead: a block on the GPU is shared, one on the
    /// host tier is claimed (the row becomes [`SeqState::Claimed`]; its first resize reloads it, so a
    /// refused admission copies nothing) unless another row claimed it. Returns the reused tokens.
    pub(super) fn match_prefix(&mut self, slot: usize, prep: ContextPrep) -> u32 {
        let Some(window) = self.prefix.as_ref().map(super::prefix::Prefix::window) else {
            return 0;
        };
        let (s, tpb, base) = (self.seqs[slot], self.cfg.tokens_per_block, self.row(slot));
        let limit = self.match_limit(slot, prep);
        if window > 0 {
            return self.match_window(slot, limit) * tpb;
        }
        let (mut key, mut m, mut claimed) = (s.root, 0u32, false);
        while m < limit {
            let next = chain(key, self.hashes[base + m as usize]);
            let Some(e) = self.prefix.as_ref().and_then(|p| p.lookup(next)) else {
                break;
            };
            let Some(prefix) = self.prefix.as_mut() else {
                break;
            };
            if e & HOST != 0 {
                // Claimed, not copied: the resize that admits the chunk reloads it. One claim a block.
                if prefix.info(e).refs() > 0 {
                    break;
                }
                claimed = true;
            } else {
                prefix.stats.gpu_hits += 1;
            }
            prefix.acquire(e);
            self.tables[base + m as usize] = e;
            key = next;
            m += 1;
        }
        let seq = &mut self.seqs[slot];
        if claimed {
            seq.state = SeqState::Claimed;
        }
        seq.blocks = m;
        seq.capacity = m * tpb;
        seq.committed = m;
        seq.chain = key;
        m * tpb
    }

    /// The first block a query at the hit point of `m` blocks reads, with a window of `w` blocks: the
    /// window rule's release (`KvPool::release_window`) at the first new position `m · tpb`.
    fn window_from(&self, w: u32, m: u32) -> u32 {
        let tpb = self.cfg.tokens_per_block;
        (m * tpb + 1).saturating_sub(w * tpb) / tpb
    }

    /// A window's cache: the most blocks `m ≤ limit` of the slot's prompt a first chunk can reuse, the
    /// blocks its first new query reads (from [`KvPool::window_from`] to `m`: the last `window`
    /// blocks, one fewer with one-token pages, all of them near the start) cached and claimable; one
    /// lookup a block.
    #[cold]
    #[inline(never)]
    fn window_hit(&self, slot: usize, limit: u32) -> u32 {
        let Some(prefix) = self.prefix.as_ref() else {
            return 0;
        };
        let (s, base, w) = (self.seqs[slot], self.row(slot), prefix.window());
        let (mut key, mut run, mut best) = (s.root, 0u32, 0u32);
        for k in 0..limit {
            key = chain(key, self.hashes[base + k as usize]);
            let there = prefix
                .lookup(key)
                .is_some_and(|e| e & HOST == 0 || prefix.info(e).refs() == 0);
            run = if there { run + 1 } else { 0 };
            if run >= k + 1 - self.window_from(w, k + 1) {
                best = k + 1;
            }
        }
        best
    }

    /// A window's first chunk reuses the longest hit within `limit` blocks ([`KvPool::window_hit`]):
    /// its row holds the hit's last window of blocks (a host one claimed, as a full match does), the
    /// blocks before them released. Returns the reused blocks.
    #[cold]
    #[inline(never)]
    fn match_window(&mut self, slot: usize, limit: u32) -> u32 {
        let m = self.window_hit(slot, limit);
        let (s, base) = (self.seqs[slot], self.row(slot));
        let w = self.prefix.as_ref().map_or(0, Prefix::window);
        let from = self.window_from(w, m);
        let Some(prefix) = self.prefix.as_mut() else {
            return 0;
        };
        let (mut key, mut claimed) = (s.root, false);
        for k in 0..m as usize {
            key = chain(key, self.hashes[base + k]);
            if k < from as usize {
                self.tables[base + k] = NO_PAGE;
                continue;
            }
            let Some(e) = prefix.lookup(key) else {
                panic!("a window's hit is cached");
            };
            if e & HOST != 0 {
                claimed = true;
            } else {
                prefix.stats.gpu_hits += 1;
            }
            prefix.acquire(e);
            self.tables[base + k] = e;
        }
        let seq = &mut self.seqs[slot];
        if claimed {
            seq.state = SeqState::Claimed;
        }
        (seq.blocks, seq.released, seq.committed) = (m, from, m);
        seq.capacity = m * self.cfg.tokens_per_block;
        seq.chain = key;
        m
    }

    /// The most blocks a first chunk may match: its hashed blocks, short of the prompt's last token and
    /// the draft lookahead, within the reuse limit and the page table.
    pub(super) fn match_limit(&self, slot: usize, prep: ContextPrep) -> u32 {
        let tpb = self.cfg.tokens_per_block;
        self.seqs[slot]
            .hashed
            .min(prep.prompt.saturating_sub(1 + prep.lookahead) / tpb)
            .min(prep.reuse_limit / tpb)
            .min(self.cfg.max_blocks)
    }

    /// Side-effect free: the tokens [`KvPool::match_prefix`] would reuse now (0 for a slot that has a
    /// cache: only a first chunk's new row matches).
    pub(super) fn probe_reuse(&self, slot: usize, prep: ContextPrep) -> u32 {
        let Some(prefix) = self.prefix.as_ref() else {
            return 0;
        };
        let (s, base) = (self.seqs[slot], self.row(slot));
        if s.state != SeqState::None {
            return 0;
        }
        if prefix.window() > 0 {
            return self.window_hit(slot, self.match_limit(slot, prep)) * self.cfg.tokens_per_block;
        }
        let (mut key, mut m) = (s.root, 0u32);
        while m < self.match_limit(slot, prep) {
            key = chain(key, self.hashes[base + m as usize]);
            match prefix.lookup(key) {
                Some(e) if e & HOST == 0 || prefix.info(e).refs() == 0 => m += 1,
                _ => break,
            }
        }
        m * self.cfg.tokens_per_block
    }

    /// Commits the row's prompt blocks computed so far (`computed` tokens) to the prefix cache, in order:
    /// a block already cached on the GPU replaces the row's copy (shared, the copy freed); one cached on
    /// the host tier is taken over by the row's copy; a new one is indexed.
    pub(super) fn commit_row(&mut self, slot: usize, computed: u32) {
        if self.prefix.is_none() {
            return;
        }
        let (s, base) = (self.seqs[slot], self.row(slot));
        let upto = s
            .hashed
            .min(computed / self.cfg.tokens_per_block)
            .min(s.blocks);
        let (mut key, mut k) = (s.chain, s.committed);
        if k < s.released {
            // A sliding window gave those blocks up before they were committed.
            (key, k) = (self.chain_to(slot, s.released), s.released);
        }
        while k < upto {
            let e = self.tables[base + k as usize];
            if e & HOST != 0 {
                break;
            }
            let next = chain(key, self.hashes[base + k as usize]);
            let Some(prefix) = self.prefix.as_mut() else {
                break;
            };
            match prefix.lookup(next) {
                Some(other) if other == e => {}
                Some(other) if other & HOST == 0 => {
                    prefix.acquire(other);
                    prefix.stats.deduplicated += 1;
                    let freed = prefix.release(e);
                    self.tables[base + k as usize] = other;
                    if freed {
                        self.push_free(e);
                    }
                }
                // A host block another row claimed (a first chunk refused after its match keeps
                // its claim while suspended) is that row's to reload: the commit stops here and
                // resumes at the next one, which then finds it on the GPU.
                Some(other) if prefix.info(other).refs() > 0 || prefix.info(other).holds() > 0 => {
                    break;
                }
                Some(other) => {
                    prefix.take_over(other, e);
                    self.push_free(other);
                }
                None => prefix.commit(e, next, key),
            }
            key = next;
            k += 1;
        }
        self.seqs[slot].committed = k;
        self.seqs[slot].chain = key;
    }

    /// The key of the first block the request would newly contribute: for a first chunk the first block
    /// of its prompt that is not cached (within the matchable part), for a later chunk the block at its
    /// position. `None` without a hash for it, or without a prefix cache.
    pub(super) fn probe_row(&self, slot: usize, prep: ContextPrep) -> Option<u64> {
        let prefix = self.prefix.as_ref()?;
        let (s, tpb, base) = (self.seqs[slot], self.cfg.tokens_per_block, self.row(slot));
        let hashes = if s.hashed == 0 {
            &[][..]
        } else {
            &self.hashes[base..base + s.hashed as usize]
        };
        if !prep.first_chunk {
            let k = (prep.position / tpb) as usize;
            return (k < hashes.len()).then(|| self.chain_to(slot, u32_of(k) + 1));
        }
        let limit = prep.prompt.saturating_sub(1 + prep.lookahead) / tpb;
        if prefix.window() > 0 {
            return self.first_new_walked(slot, limit);
        }
        // The first block past the matchable part or the indexed chain (`trial.rs`'s memo).
        self.key_after(slot, limit)
    }

    /// [`KvPool::probe_row`]'s first chunk, block by block (a window's cache, whose chain may have
    /// gaps).
    fn first_new_walked(&self, slot: usize, limit: u32) -> Option<u64> {
        let prefix = self.prefix.as_ref()?;
        let (s, base) = (self.seqs[slot], self.row(slot));
        let mut key = s.root;
        for k in 0..s.hashed {
            key = chain(key, self.hashes[base + k as usize]);
            if k >= limit || prefix.lookup(key).is_none() {
                return Some(key);
            }
        }
        None
    }

    /// Sets the slot's prompt block hashes and root (before it has a cache).
    pub(super) fn set_prefix_row(&mut self, slot: usize, root: u64, hashes: &[u64]) {
        let n = if self.prefix.is_some() {
            hashes.len().min(self.cfg.max_blocks as usize)
        } else {
            0
        };
        if n > 0 {
            let base = self.row(slot);
            self.hashes[base..base + n].copy_from_slice(&hashes[..n]);
        }
        let s = &mut self.seqs[slot];
        *s = Seq {
            root,
            hashed: u32_of(n),
            chain: root,
            ..Seq::default()
        };
    }
}
