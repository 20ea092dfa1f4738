//! The scheduler's public API for inspection: its configuration and backends, its requests, its
//! fingerprint and its invariant check ([`Scheduler::check`]).

use crate::adapter::PeftBackend;
use crate::config::Config;
use crate::error::Error;
use crate::ids::{RequestId, TaskSlot};
use crate::kv::{AdapterPaging, KvBackend, KvCaps, KvRef};
use crate::lease::AdapterDesk;
use crate::phase::Phase;
use crate::request::Ownership;
use crate::storage::Storage;

use super::{Entry, Handle, PassStats, Scheduler};
use crate::narrow::u16_of;

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Scheduler<K, P, N, T, S>
{
    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }
    /// The KV backend, read-only (statistics, block tables, invariant checks).
    pub fn kv(&self) -> &K {
        &self.kv
    }
    /// Plants `fault` in the KV backend (feature `fault-injection`; the backend is otherwise lent out
    /// read-only); returns whether the backend had what it breaks.
    #[cfg(feature = "fault-injection")]
    pub fn plant(&mut self, fault: crate::page_pool::PoolFault) -> bool
    where
        K: crate::page_pool::PlantFault,
    {
        self.changed();
        self.kv.plant(fault)
    }
    /// Plants a lease counted on `slot` that no request holds (feature `fault-injection`); `false`
    /// for a slot the desk does not have.
    #[cfg(feature = "fault-injection")]
    pub fn plant_kept_lease(&mut self, slot: TaskSlot) -> bool {
        self.changed();
        self.desk.plant_kept_lease(slot)
    }
    /// The adapter desk, read-only (leases, pinned pages, and the adapter backend through it).
    pub fn adapters(&self) -> &AdapterDesk<P, T, S> {
        &self.desk
    }
    /// What the last pass did beyond its output lists.
    pub fn last_pass(&self) -> PassStats {
        self.last
    }
    /// Consecutive stalled passes.
    pub fn stall_count(&self) -> u32 {
        self.stall
    }
    /// Live requests.
    pub fn len(&self) -> usize {
        self.table.len()
    }
    /// No live requests.
    pub fn is_empty(&self) -> bool {
        self.table.len() == 0
    }
    /// Requests in arrival order.
    pub fn requests(&self) -> impl Iterator<Item = (Handle, Entry<'_>)> + '_ {
        self.table.iter()
    }
    /// One request.
    pub fn get(&self, h: Handle) -> Result<Entry<'_>, Error> {
        self.table.get(h).ok_or(Error::StaleHandle)
    }
    /// The live handle of a table slot.
    pub fn handle_of(&self, slot: u16) -> Option<Handle> {
        self.table.handle_at(slot)
    }
    /// Finds a request by id (O(1): the table keeps an id index).
    pub fn find(&self, id: RequestId) -> Option<Handle> {
        self.table.handle_at(self.table.find(id)?)
    }

    /// A fingerprint of the scheduler's own state: the request table (entries, hot records, arrival
    /// order, id index), the counters and the adapter desk. The backends are left out: fingerprint those
    /// with [`crate::KvPool::fingerprint`] and the adapter cache's `PartialEq`. Equal before and after a
    /// refused call = the call changed nothing.
    pub fn fingerprint(&self) -> u64 {
        use core::hash::{Hash, Hasher};
        let mut h = crate::fingerprint::Fingerprint::new();
        self.table.hash_state(&mut h);
        self.stall.hash(&mut h);
        self.blocked.hash(&mut h);
        self.passes.hash(&mut h);
        self.completed.hash(&mut h);
        self.desk.hash_state(&mut h);
        self.clients.hash_state(&mut h);
        self.adapter_waits.hash(&mut h);
        h.finish()
    }

    /// The table's invariants and the ownership agreements with the backends: every request on the GPU
    /// has an active cache, no suspended or recompute-paused one does, and per task the desk's leases
    /// equal the requests holding one.
    pub fn check(&self) -> bool {
        let mut leases = [0u32; T];
        let agree = self.table.iter().all(|(h, e)| {
            if let (true, Some(t)) = (e.ownership().on_gpu(), e.task()) {
                if let Some(n) = leases.get_mut(t.slot.index()) {
                    *n += 1;
                }
            }
            self.agrees(h, e)
        });
        // Unified paging: between passes an adapter's pins are its leases.
        let adapters = self.kv.caps().adapters;
        let pinned = |s: usize| {
            adapters
                .and_then(|a| a.adapter_pins(TaskSlot(u16_of(s))))
                .is_none_or(|n| n == leases[s])
        };
        agree
            && self.table.check()
            && (0..T).all(|s| self.desk.leases(TaskSlot(u16_of(s))) == leases[s] && pinned(s))
    }

    /// The spot check of the requests a pass touched (by table slot), O(1) each: [`Scheduler::check`]'s
    /// invariants for those entries alone (the table's records, the ownership agreement with the pools);
    /// a vacant slot must hold nothing. The leases per task are `check`'s.
    pub fn check_requests(&self, slots: impl IntoIterator<Item = u16>) -> bool {
        slots.into_iter().all(|s| {
            self.table.check_slot(s)
                && self
                    .table
                    .handle_at(s)
                    .is_none_or(|h| self.agrees(h, self.table.entry(s)))
        })
    }

    /// A request's ownership agrees with its KV cache: on the GPU an active cache, elsewhere none.
    fn agrees(&self, h: Handle, e: Entry<'_>) -> bool {
        let r = KvRef {
            slot: h.index(),
            id: e.spec().id,
        };
        match e.ownership() {
            Ownership::Active | Ownership::Resumed => self.kv.cache(r).is_active(),
            // A sending request's pages stay active, pinned for the transfer manager; its
            // phase says so.
            Ownership::Sending => {
                self.kv.cache(r).is_active()
                    && e.spec().phase == Phase::DisaggContextTransInProgress
            }
            Ownership::Paused => !self.kv.cache(r).is_active(),
            Ownership::Waiting | Ownership::Recompute => !self.kv.cache(r).is_active(),
        }
    }
}
