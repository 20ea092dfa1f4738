//! Heap-backed storage for the core's borrowed-storage page pool (the core itself never allocates).

use kvsched_core::page_pool::{KvPool, KvPoolConfig, KvStorage, PageMove, Seq};

/// Owns the buffers of one [`KvPool`]; lend them with [`KvMemory::pool`].
#[derive(Debug, Clone)]
pub struct KvMemory {
    cfg: KvPoolConfig,
    gpu_free: Vec<u32>,
    host_free: Vec<u32>,
    tables: Vec<u32>,
    seqs: Vec<Seq>,
    moves: Vec<PageMove>,
}

impl KvMemory {
    /// Buffers sized for `cfg`.
    pub fn new(cfg: KvPoolConfig) -> Self {
        Self {
            cfg,
            gpu_free: vec![0; cfg.gpu_pages as usize],
            host_free: vec![0; cfg.host_pages as usize],
            tables: vec![0; cfg.table_len()],
            seqs: vec![Seq::default(); cfg.slots as usize],
            moves: vec![PageMove::default(); cfg.move_log_len()],
        }
    }

    /// A fresh, empty pool over these buffers.
    pub fn pool(&mut self) -> Result<KvPool<'_>, kvsched_core::Error> {
        KvPool::new(
            self.cfg,
            KvStorage {
                gpu_free: &mut self.gpu_free,
                host_free: &mut self.host_free,
                tables: &mut self.tables,
                seqs: &mut self.seqs,
                moves: &mut self.moves,
            },
        )
    }

    /// Bytes the buffers take.
    pub fn bytes(&self) -> usize {
        (self.gpu_free.len() + self.host_free.len() + self.tables.len()) * 4
            + self.seqs.len() * std::mem::size_of::<Seq>()
            + self.moves.len() * std::mem::size_of::<PageMove>()
    }
}
