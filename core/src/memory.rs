//! Heap-backed storage for the borrowed-storage page pool (feature `alloc`): the buffers a host
//! program owns and lends to a [`KvPool`]. The rest of the core never allocates; without the feature
//! this module does not exist.

use alloc::vec;
use alloc::vec::Vec;

use crate::kv::PageMove;
use crate::page_pool::{
    AdapterPages, AdapterStorage, KvPool, KvPoolConfig, KvStorage, PageInfo, PrefixStorage, Seq,
};

/// Owns the buffers of one [`KvPool`]; lend them with [`KvMemory::pool`].
#[derive(Debug, Clone)]
pub struct KvMemory {
    cfg: KvPoolConfig,
    gpu_free: Vec<u32>,
    host_free: Vec<u32>,
    tables: Vec<u32>,
    seqs: Vec<Seq>,
    moves: Vec<PageMove>,
    /// The prefix cache's buffers, when the pool has one.
    prefix: Option<PrefixMemory>,
    /// Unified paging's buffers (adapter slots, page links), when the pool holds adapters.
    adapters: Option<(Vec<AdapterPages>, Vec<u32>)>,
}

/// The buffers of a prefix cache.
#[derive(Debug, Clone)]
struct PrefixMemory {
    pages: Vec<PageInfo>,
    index: Vec<u32>,
    hashes: Vec<u64>,
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
            prefix: None,
            adapters: None,
        }
    }

    /// The same buffers, with unified paging for `task_slots` adapter slots: the pool will hold the
    /// adapters' device copies beside the KV ([`KvPool::page_adapters`]).
    pub fn with_unified_adapters(mut self, task_slots: usize) -> Self {
        self.adapters = Some((
            vec![AdapterPages::default(); task_slots],
            vec![0; self.cfg.gpu_pages as usize],
        ));
        self
    }

    /// Buffers sized for `cfg`, with a prefix cache.
    pub fn with_prefix_cache(cfg: KvPoolConfig) -> Self {
        let mut m = Self::new(cfg);
        m.prefix = Some(PrefixMemory {
            pages: vec![PageInfo::default(); cfg.page_info_len()],
            index: vec![0; cfg.index_len()],
            hashes: vec![0; cfg.table_len()],
        });
        m
    }

    /// [`KvMemory::try_new`] with a prefix cache.
    pub fn try_with_prefix_cache(cfg: KvPoolConfig) -> Result<Self, crate::Error> {
        let mut m = Self::try_new(cfg)?;
        m.prefix = Some(PrefixMemory {
            pages: buffer(cfg.page_info_len(), PageInfo::default())?,
            index: buffer(cfg.index_len(), 0)?,
            hashes: buffer(cfg.table_len(), 0)?,
        });
        Ok(m)
    }

    /// Buffers sized for `cfg`, after checking the geometry ([`KvPoolConfig::validate`]) and reserving
    /// the memory: an invalid or unaffordable geometry is an error, never an abort.
    pub fn try_new(cfg: KvPoolConfig) -> Result<Self, crate::Error> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            gpu_free: buffer(cfg.gpu_pages as usize, 0)?,
            host_free: buffer(cfg.host_pages as usize, 0)?,
            tables: buffer(cfg.table_len(), 0)?,
            seqs: buffer(cfg.slots as usize, Seq::default())?,
            moves: buffer(cfg.move_log_len(), PageMove::default())?,
            prefix: None,
            adapters: None,
        })
    }

    /// A fresh, empty pool over these buffers.
    pub fn pool(&mut self) -> Result<KvPool<'_>, crate::Error> {
        let mut pool = KvPool::new(
            self.cfg,
            KvStorage {
                gpu_free: &mut self.gpu_free,
                host_free: &mut self.host_free,
                tables: &mut self.tables,
                seqs: &mut self.seqs,
                moves: &mut self.moves,
                prefix: self.prefix.as_mut().map(|p| PrefixStorage {
                    pages: &mut p.pages,
                    index: &mut p.index,
                    hashes: &mut p.hashes,
                }),
            },
        )?;
        if let Some((slots, links)) = self.adapters.as_mut() {
            pool.page_adapters(AdapterStorage { slots, links })?;
        }
        Ok(pool)
    }

    /// Bytes the buffers take.
    pub fn bytes(&self) -> usize {
        (self.gpu_free.len() + self.host_free.len() + self.tables.len()) * 4
            + self.seqs.len() * core::mem::size_of::<Seq>()
            + self.moves.len() * core::mem::size_of::<PageMove>()
            + self.prefix.as_ref().map_or(0, |p| {
                p.pages.len() * core::mem::size_of::<PageInfo>()
                    + p.index.len() * 4
                    + p.hashes.len() * 8
            })
            + self.adapters.as_ref().map_or(0, |(s, l)| {
                s.len() * core::mem::size_of::<AdapterPages>() + l.len() * 4
            })
    }
}

/// A buffer of `len` copies of `fill`, reserved first: an allocation that cannot be had is an error.
fn buffer<T: Clone>(len: usize, fill: T) -> Result<Vec<T>, crate::Error> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| crate::Error::Invalid("KV pool buffers do not fit in memory"))?;
    v.resize(len, fill);
    Ok(v)
}
