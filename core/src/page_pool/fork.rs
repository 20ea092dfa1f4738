//! Forks (beyond the reference; [`PrefixReuse::fork`](crate::kv::PrefixReuse::fork)): a row with no
//! cache takes another row's full blocks by reference.
//!
//! The shared pages are reference-counted as the prefix cache counts every page (`prefix.rs`,
//! invariant 1: `refs` = the rows holding it), whether they are cached blocks or a row's own: a page
//! two rows hold is not private, so suspension leaves it on the GPU and neither row's release frees
//! it while the other holds it. Only full blocks are shared, and only those before the child's last
//! token: every write of either row goes past them (a decode step, a chunk, a rewind all write at or
//! after their row's position), so no page is written while shared. The child computes its partial
//! last block itself, as its first chunk.

use super::{KvPool, Seq, SeqState, HOST};
use crate::storage::Buffers;

impl<B: Buffers> KvPool<'_, B> {
    /// Side-effect free: the blocks row `child` (no cache) would take from row `parent` (active on the
    /// GPU, all of them on the GPU): its full blocks before the last of its first `tokens` tokens.
    /// `None`: no prefix cache (no reference counts), a sliding window's pool, a KV connector's, rows
    /// not so, or nothing to share.
    pub(super) fn fork_blocks(&self, parent: usize, child: usize, tokens: u32) -> Option<u32> {
        let (p, tpb) = (self.seqs[parent], self.cfg.tokens_per_block);
        let prefix = self.prefix.as_ref()?;
        if prefix.window() > 0
            || self.connector.is_some()
            || parent == child
            || p.state != SeqState::Active
            || self.seqs[child].state != SeqState::None
            || tokens == 0
            || tokens > p.capacity
        {
            return None;
        }
        let blocks = ((tokens - 1) / tpb).min(p.blocks);
        let from = self.row(parent);
        let shared = &self.tables[from..from + blocks as usize];
        (blocks > 0 && shared.iter().all(|&e| e & HOST == 0)).then_some(blocks)
    }

    /// Row `child` takes [`KvPool::fork_blocks`] of row `parent`'s blocks by reference, and its
    /// prompt's block hashes and root, so its commits continue the parent's chain. Returns the tokens
    /// shared; `None`, changing nothing, where `fork_blocks` says none.
    pub(super) fn fork_row(&mut self, parent: usize, child: usize, tokens: u32) -> Option<u32> {
        let blocks = self.fork_blocks(parent, child, tokens)?;
        let (p, tpb) = (self.seqs[parent], self.cfg.tokens_per_block);
        let (from, to) = (self.row(parent), self.row(child));
        let prefix = self.prefix.as_mut()?;
        for k in 0..blocks as usize {
            let e = self.tables[from + k];
            prefix.acquire(e);
            self.tables[to + k] = e;
        }
        // The child's prompt's own blocks only: past them its tokens are its own.
        let hashed = p.hashed.min(tokens / tpb);
        self.hashes.copy_within(from..from + hashed as usize, to);
        self.seqs[child] = Seq {
            state: SeqState::Active,
            capacity: blocks * tpb,
            blocks,
            root: p.root,
            hashed,
            chain: p.root,
            ..Seq::default()
        };
        // The parent's commits that the child shares are the child's (from its root, as a replay's).
        let committed = p.committed.min(blocks);
        let chain = if committed == p.committed {
            p.chain
        } else {
            self.chain_to(child, committed)
        };
        let s = &mut self.seqs[child];
        (s.committed, s.chain) = (committed, chain);
        Some(blocks * tpb)
    }
}
