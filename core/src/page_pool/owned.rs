//! A pool that owns its buffers on the heap (feature `alloc`): [`KvPool::owned`] and its options. The
//! buffers are reserved before they are filled (`try_reserve`), so an invalid geometry or one that
//! does not fit in memory is an error, never an abort; the pool is then built over them exactly as
//! over borrowed ones ([`KvPool::new`]).

use super::Seq;
use super::{
    AdapterBuffers, AdapterPages, KvBuffers, KvPool, KvPoolConfig, PageInfo, PrefixBuffers,
};
use crate::error::Error;
use crate::kv::PageMove;
use crate::kv_events::KvEvent;
use crate::storage::{boxed_slice, Owned};

impl KvBuffers<Owned> {
    /// Heap buffers sized for `cfg` (with a prefix cache's when `prefix`), after checking the geometry
    /// ([`KvPoolConfig::validate`]).
    pub fn alloc(cfg: KvPoolConfig, prefix: bool) -> Result<Self, Error> {
        cfg.validate()?;
        let prefix = if prefix {
            Some(PrefixBuffers {
                pages: boxed_slice(cfg.page_info_len(), PageInfo::default())?,
                index: boxed_slice(cfg.index_len(), 0)?,
                hashes: boxed_slice(cfg.table_len(), 0)?,
                stamps: boxed_slice(cfg.stamps_len(), 0)?,
            })
        } else {
            None
        };
        Ok(Self {
            gpu_free: boxed_slice(cfg.gpu_pages as usize, 0)?,
            host_free: boxed_slice(cfg.host_pages as usize, 0)?,
            tables: boxed_slice(cfg.table_len(), 0)?,
            seqs: boxed_slice(cfg.slots as usize, Seq::default())?,
            moves: boxed_slice(cfg.move_log_len(), PageMove::default())?,
            prefix,
        })
    }
}

impl KvPool<'_, Owned> {
    /// A pool for `cfg` that owns its buffers. Refused for an invalid geometry
    /// ([`KvPoolConfig::validate`]) or buffers that do not fit in memory.
    pub fn owned(cfg: KvPoolConfig) -> Result<Self, Error> {
        Self::new(cfg, KvBuffers::alloc(cfg, false)?)
    }

    /// [`KvPool::owned`] with a prefix cache.
    pub fn owned_with_prefix_cache(cfg: KvPoolConfig) -> Result<Self, Error> {
        Self::new(cfg, KvBuffers::alloc(cfg, true)?)
    }

    /// The same pool with a KV event log of `capacity` events ([`KvPool::log_kv_events`]).
    pub fn with_kv_events(mut self, capacity: usize) -> Result<Self, Error> {
        self.log_kv_events(boxed_slice(capacity, KvEvent::default())?)?;
        Ok(self)
    }

    /// The same pool with unified paging for `task_slots` adapter slots: it will hold the adapters'
    /// device copies beside the KV ([`KvPool::page_adapters`]). Refused as `page_adapters` is.
    pub fn with_unified_adapters(mut self, task_slots: usize) -> Result<Self, Error> {
        self.page_adapters(AdapterBuffers {
            slots: boxed_slice(task_slots, AdapterPages::default())?,
            links: boxed_slice(self.cfg.gpu_pages as usize, 0)?,
        })?;
        Ok(self)
    }
}
