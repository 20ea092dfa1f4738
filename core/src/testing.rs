//! Test fixtures shared by the crate's unit tests: a KV pool over owned buffers (no heap), placed where
//! a test needs it.

use crate::kv::{ContextPrep, KvBackend, KvRef, PageMove};
use crate::page_pool::{KvPool, KvPoolConfig, KvStorage, Seq};

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

    /// A pool with `host` host pages (at most `H`) and `tokens_per_block` tokens a page.
    pub(crate) fn pool(&mut self, host: u32, tokens_per_block: u32) -> KvPool<'_> {
        let cfg = KvPoolConfig {
            tokens_per_block,
            gpu_pages: G as u32,
            host_pages: host,
            slots: S as u32,
            max_blocks: (TB / S) as u32,
        };
        let moves = cfg.move_log_len();
        KvPool::new(
            cfg,
            KvStorage {
                gpu_free: &mut self.gpu,
                host_free: &mut self.host[..host as usize],
                tables: &mut self.tables,
                seqs: &mut self.seqs,
                moves: &mut self.moves[..moves],
                prefix: None,
            },
        )
        .expect("a valid test pool")
    }
}

/// The small pool most tests use: 16 GPU pages, up to 16 host pages, 4 slots of 8 pages, 4 tokens a page.
pub(crate) type Small = Mem<16, 16, 4, 32, 32>;

/// Gives a first chunk of `tokens` tokens its KV pages, as the pass does before admission.
pub(crate) fn place(kv: &mut KvPool<'_>, r: KvRef, tokens: u32) {
    let prep = ContextPrep {
        first_chunk: true,
        prompt: tokens,
        position: 0,
        lookahead: 0,
    };
    assert!(kv.prepare_context(r, prep).is_some());
    assert!(kv.resize_context(r, tokens, true));
}
