//! Faults planted on purpose (feature `fault-injection`): each breaks one invariant the pool's checks
//! know, so that a test can show which check catches it and when. Never for serving: a planted fault
//! is exactly what the pool's API otherwise cannot produce.

use super::{page_of, KvPool, SeqState};
use crate::kv::Tier;
use crate::storage::Buffers;

/// An invariant of the pool broken on purpose ([`KvPool::plant`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolFault {
    /// A page a row holds gets one reference more than the rows naming it (prefix cache only).
    ExtraRef,
    /// A page a row holds is also put on the GPU free stack (at its bottom, popped last).
    FreeAndHeld,
    /// An empty slot of the prefix index names a free page (prefix cache only).
    OrphanIndexEntry,
}

/// A KV backend a fault can be planted in (through `Scheduler::plant`, which otherwise lends its
/// backend out read-only).
pub trait PlantFault {
    /// Plants `fault`; returns whether the backend had what it breaks (a held GPU page, a prefix
    /// cache).
    fn plant(&mut self, fault: PoolFault) -> bool;
}

impl<B: Buffers> PlantFault for KvPool<'_, B> {
    fn plant(&mut self, fault: PoolFault) -> bool {
        match fault {
            PoolFault::ExtraRef => match (self.held_gpu_page(), self.prefix.as_mut()) {
                (Some(e), Some(p)) => {
                    p.plant_extra_ref(e);
                    true
                }
                _ => false,
            },
            PoolFault::FreeAndHeld => {
                let Some(e) = self.held_gpu_page() else {
                    return false;
                };
                let n = self.gpu_free_len as usize;
                self.gpu_free[n] = self.gpu_free[0];
                self.gpu_free[0] = e;
                self.gpu_free_len += 1;
                true
            }
            PoolFault::OrphanIndexEntry => {
                let free = self.gpu_free[..self.gpu_free_len as usize].first().copied();
                match (free, self.prefix.as_mut()) {
                    (Some(e), Some(p)) => p.plant_orphan(e),
                    _ => false,
                }
            }
        }
    }
}

impl<B: Buffers> KvPool<'_, B> {
    /// The first GPU page an active row holds.
    fn held_gpu_page(&self) -> Option<u32> {
        self.seqs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state == SeqState::Active)
            .flat_map(|(slot, s)| self.row_entries(slot, s).iter().copied())
            .find(|&e| page_of(e).0 == Tier::Gpu)
    }
}
