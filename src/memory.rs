//! Heap-backed storage for the core's borrowed-storage page pool (the core itself never allocates).

use kvsched_core::kv::PageMove;
use kvsched_core::page_pool::{KvPool, KvPoolConfig, KvStorage, Seq};

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

    /// Buffers sized for `cfg`, after checking the geometry ([`KvPoolConfig::validate`]) and reserving
    /// the memory: an invalid or unaffordable geometry is an error, never an abort.
    pub fn try_new(cfg: KvPoolConfig) -> Result<Self, kvsched_core::Error> {
        cfg.validate()?;
        fn buffer<T: Clone>(len: usize, fill: T) -> Result<Vec<T>, kvsched_core::Error> {
            let mut v = Vec::new();
            v.try_reserve_exact(len).map_err(|_| {
                kvsched_core::Error::Invalid("KV pool buffers do not fit in memory")
            })?;
            v.resize(len, fill);
            Ok(v)
        }
        Ok(Self {
            cfg,
            gpu_free: buffer(cfg.gpu_pages as usize, 0)?,
            host_free: buffer(cfg.host_pages as usize, 0)?,
            tables: buffer(cfg.table_len(), 0)?,
            seqs: buffer(cfg.slots as usize, Seq::default())?,
            moves: buffer(cfg.move_log_len(), PageMove::default())?,
        })
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
