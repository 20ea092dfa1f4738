//! Test fixtures shared by the crate's unit tests: a KV pool over owned buffers (no heap), placed where
//! a test needs it.

use crate::kv::{ContextPrep, KvBackend, KvRef, PageMove};
use crate::page_pool::{KvPool, KvPoolConfig, KvStorage, PageInfo, PrefixStorage, Seq};

/// The buffers of a pool with at most `G` GPU pages, `H` host pages, `S` slots and `B` pages a table.
pub(crate) struct Mem<
    const G: usize,
    const H: usize,
    const S: usize,
    const TB: usize,
    const M: usize,
> {
    gpu: [u32; G],
    host: [u32; H],
    tables: [u32; TB],
    seqs: [Seq; S],
    moves: [PageMove; M],
}

impl<const G: usize, const H: usize, const S: usize, const TB: usize, const M: usize>
    Mem<G, H, S, TB, M>
{
    pub(crate) fn new() -> Self {
        Self {
            gpu: [0; G],
            host: [0; H],
            tables: [0; TB],
            seqs: [Seq::default(); S],
            moves: [PageMove::default(); M],
        }
    }

    fn config(host: u32, tokens_per_block: u32) -> KvPoolConfig {
        KvPoolConfig {
            tokens_per_block,
            gpu_pages: G as u32,
            host_pages: host,
            slots: S as u32,
            max_blocks: (TB / S) as u32,
        }
    }

    /// A pool with `host` host pages (at most `H`) and `tokens_per_block` tokens a page.
    pub(crate) fn pool(&mut self, host: u32, tokens_per_block: u32) -> KvPool<'_> {
        self.pool_with::<0, 0>(host, tokens_per_block, None)
    }

    /// [`Mem::pool`] with a prefix cache over `prefix`'s buffers.
    pub(crate) fn pool_with<'a, const P: usize, const I: usize>(
        &'a mut self,
        host: u32,
        tokens_per_block: u32,
        prefix: Option<&'a mut PrefixMem<P, I, TB>>,
    ) -> KvPool<'a> {
        let cfg = Self::config(host, tokens_per_block);
        let moves = cfg.move_log_len();
        let prefix = prefix.map(|m| PrefixStorage {
            pages: &mut m.pages[..cfg.page_info_len()],
            index: &mut m.index[..cfg.index_len()],
            hashes: &mut m.hashes,
            stamps: &mut m.stamps[..cfg.stamps_len()],
        });
        KvPool::new(
            cfg,
            KvStorage {
                gpu_free: &mut self.gpu,
                host_free: &mut self.host[..host as usize],
                tables: &mut self.tables,
                seqs: &mut self.seqs,
                moves: &mut self.moves[..moves],
                prefix,
            },
        )
        .expect("a valid test pool")
    }
}

/// The buffers of a prefix cache: `P` page entries (at least GPU + host pages), an index of `I`
/// entries (at least the pool's [`KvPoolConfig::index_len`]), and the hash rows of `TB` table entries.
pub(crate) struct PrefixMem<const P: usize, const I: usize, const TB: usize> {
    pages: [PageInfo; P],
    index: [u32; I],
    hashes: [u64; TB],
    stamps: [u32; I],
}

impl<const P: usize, const I: usize, const TB: usize> PrefixMem<P, I, TB> {
    pub(crate) fn new() -> Self {
        Self {
            pages: [PageInfo::default(); P],
            index: [0; I],
            hashes: [0; TB],
            stamps: [0; I],
        }
    }
}

/// The small pool most tests use: 16 GPU pages, up to 16 host pages, 4 slots of 8 pages, 4 tokens a page.
pub(crate) type Small = Mem<16, 16, 4, 32, 32>;

/// Gives a first chunk of `tokens` tokens its KV pages, as the pass does before admission.
pub(crate) fn place(kv: &mut KvPool<'_>, r: KvRef, tokens: u32) {
    let prep = ContextPrep::first(tokens);
    assert!(kv.prepare_context(r, prep).is_some());
    assert!(kv.resize_context(r, tokens, true));
}
