//! Adapter leases and the desk that mints and consumes them.
//!
//! An [`AdapterLease`] is the proof that one request holds device ownership of one adapter. It is not
//! `Clone`/`Copy`, it carries the id of the request it was minted for, and only the [`AdapterDesk`]
//! creates and consumes it — inside this crate (`acquire` and `release` are crate-private; the desk
//! itself is made only by the scheduler). A [`PausedOn`] token is the proof that a request is registered
//! as *paused* on an adapter (its host copy stays pinned for a resume or a replay).
//!
//! Invariants (asserted where they can break, and by the property tests):
//! - for every task, live leases = the backend's device refcount (`active`);
//! - a lease or paused registration is returned by the request it was minted for (checked on release);
//! - `pinned` lists exactly the task slots with at least one lease, and `pinned_pages` is the sum of
//!   their page counts.
//!
//! The per-pass PEFT page budget built on the pinned set lives with the pass (`scheduler::plan`).

use crate::adapter::{AdapterHold, PeftBackend, TaskRef};
use crate::bomb::Bomb;
use crate::error::PeftError;
use crate::ids::{RequestId, TaskId, TaskSlot};
use crate::kv::{AdapterPaging, KvBackend, KvCaps};
use crate::storage::{FixedList, Inline, InlineArray, Storage};

/// A task slot kept as slot + 1, so that an optional token costs nothing (16 bytes with its holder).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SlotPlusOne(core::num::NonZeroU16);

impl SlotPlusOne {
    fn of(task: TaskRef) -> Self {
        match task
            .slot
            .0
            .checked_add(1)
            .and_then(core::num::NonZeroU16::new)
        {
            Some(n) => Self(n),
            None => panic!("task slot {} is beyond the task table", task.slot),
        }
    }
    fn slot(self) -> TaskSlot {
        TaskSlot(self.0.get() - 1)
    }
}

/// Device ownership of one adapter by one request. Minted and consumed only by [`AdapterDesk`].
#[must_use = "a lease must be returned to the adapter desk"]
#[derive(Debug)]
pub struct AdapterLease {
    holder: RequestId,
    task: SlotPlusOne,
    bomb: Bomb,
}

impl AdapterLease {
    /// The slot of the task this lease pins.
    pub fn task_slot(&self) -> TaskSlot {
        self.task.slot()
    }
    /// The request it was minted for.
    pub fn holder(&self) -> RequestId {
        self.holder
    }
}

/// A paused registration of a request on an adapter. Minted and consumed only by [`AdapterDesk`].
#[must_use = "a paused registration must be resumed or dropped through the adapter desk"]
#[derive(Debug)]
pub struct PausedOn {
    holder: RequestId,
    task: SlotPlusOne,
    bomb: Bomb,
}

impl PausedOn {
    /// The slot of the task the request is paused on.
    pub fn task_slot(&self) -> TaskSlot {
        self.task.slot()
    }
    /// The paused request.
    pub fn holder(&self) -> RequestId {
        self.holder
    }
}

static_assertions::assert_not_impl_any!(AdapterLease: Clone, Copy, Default);
static_assertions::assert_not_impl_any!(PausedOn: Clone, Copy, Default);
static_assertions::assert_eq_size!(Option<AdapterLease>, [u64; 2]);

/// Mints and consumes leases over a [`PeftBackend`] with `T` task slots (its per-slot arrays where
/// `S` keeps them).
pub struct AdapterDesk<P, const T: usize, S: Storage = Inline> {
    backend: P,
    leases: S::Array<u32, T>,
    pages: S::Array<u32, T>,
    /// The id of each task slot leased so far.
    ids: S::Array<TaskId, T>,
    pinned: S::List<TaskSlot, T>,
    pinned_pages: u32,
}

impl<P: core::fmt::Debug, const T: usize, S: Storage> core::fmt::Debug for AdapterDesk<P, T, S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AdapterDesk")
            .field("backend", &self.backend)
            .field("leases", &&self.leases[..])
            .field("pinned", &&self.pinned[..])
            .field("pinned_pages", &self.pinned_pages)
            .finish_non_exhaustive()
    }
}

impl<P, const T: usize> AdapterDesk<P, T> {
    /// A desk over `backend`, its arrays inside the value.
    pub(crate) const fn new(backend: P) -> Self {
        Self {
            backend,
            leases: InlineArray::new([0; T]),
            pages: InlineArray::new([0; T]),
            ids: InlineArray::new([TaskId(0); T]),
            pinned: heapless::Vec::new(),
            pinned_pages: 0,
        }
    }
}

impl<P: PeftBackend, const T: usize, S: Storage> AdapterDesk<P, T, S> {
    /// A desk over `backend`, its arrays in storage `S`.
    pub(crate) fn new_in(backend: P) -> Result<Self, crate::Error> {
        Ok(Self {
            backend,
            leases: S::array(|| 0)?,
            pages: S::array(|| 0)?,
            ids: S::array(|| TaskId(0))?,
            pinned: S::list(TaskSlot(0))?,
            pinned_pages: 0,
        })
    }

    /// The backend, read-only (statistics, task table, invariant checks).
    pub fn backend(&self) -> &P {
        &self.backend
    }

    pub(crate) fn backend_mut(&mut self) -> &mut P {
        &mut self.backend
    }

    /// A lease counted on `slot` that no request holds (feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn plant_kept_lease(&mut self, slot: TaskSlot) -> bool {
        match self.leases.get_mut(slot.index()) {
            Some(n) => {
                *n += 1;
                true
            }
            None => false,
        }
    }

    /// Live leases on a task slot.
    pub fn leases(&self, slot: TaskSlot) -> u32 {
        self.leases.get(slot.index()).copied().unwrap_or(0)
    }

    /// Feeds the desk's own state (lease counts, page counts, pinned set) to `h`; the backend is not
    /// included.
    pub fn hash_state<H: core::hash::Hasher>(&self, h: &mut H) {
        use core::hash::Hash;
        self.leases.hash(h);
        self.pages.hash(h);
        self.pinned.hash(h);
        self.pinned_pages.hash(h);
    }

    /// Pages pinned on the device by lease holders.
    pub fn pinned_pages(&self) -> u32 {
        self.pinned_pages
    }

    /// Task slots with at least one lease.
    pub fn pinned_tasks(&self) -> &[TaskSlot] {
        &self.pinned
    }

    /// The task in slot `slot`, once it was leased (a pinned task's).
    pub(crate) fn task_ref(&self, slot: TaskSlot) -> TaskRef {
        TaskRef {
            id: self.ids[slot.index()],
            slot,
        }
    }

    /// The device pages of the task in slot `slot`, as last determined (0 before the first time).
    pub(crate) fn known_pages(&self, slot: TaskSlot) -> u32 {
        self.pages.get(slot.index()).copied().unwrap_or(0)
    }

    /// Asks the backend for the task's page count (for request `req`) and remembers it.
    pub(crate) fn determine_pages(&mut self, req: RequestId, task: TaskRef) -> u32 {
        let pages = self.backend.determine_num_pages(req, task);
        if let Some(p) = self.pages.get_mut(task.slot.index()) {
            *p = pages;
        }
        pages
    }

    /// Registers `req` as active on `task` and mints its lease. `paused`: the request's paused
    /// registration, consumed on success (this is a resume or replay). On refusal everything is handed
    /// back unchanged.
    ///
    /// With unified paging ([`KvBackend::adapters`]) the lease also pins the adapter in the KV pool
    /// (placing it there first); a refused pin is a refused lease.
    pub(crate) fn acquire<K: KvBackend>(
        &mut self,
        kv: &mut K,
        req: RequestId,
        task: TaskRef,
        paused: Option<PausedOn>,
    ) -> Result<AdapterLease, (Option<PausedOn>, PeftError)> {
        let s = task.slot.index();
        if s >= T {
            return Err((paused, PeftError::TaskTableFull));
        }
        if let Some(p) = &paused {
            assert_eq!(
                p.holder, req,
                "a paused registration resumes its own request"
            );
            assert_eq!(
                p.task.slot(),
                task.slot,
                "a paused registration resumes on its own task"
            );
        }
        // The first lease reads the page count afresh (a reloaded adapter may have a new size).
        let pages = if self.leases[s] == 0 {
            self.backend.determine_num_pages(req, task)
        } else {
            self.pages[s]
        };
        if !kv
            .adapters()
            .is_none_or(|a| a.pin_adapter(req, task.slot, pages))
        {
            let e = PeftError::KvPagesFull {
                task: task.id,
                needed: pages,
            };
            return Err((paused, e));
        }
        if let Err(e) = self.backend.add_request(req, task, paused.is_some()) {
            if let Some(a) = kv.adapters() {
                a.unpin_adapter(task.slot);
            }
            return Err((paused, e));
        }
        if let Some(p) = paused {
            p.bomb.defuse();
        }
        self.pages[s] = pages;
        self.ids[s] = task.id;
        self.leases[s] += 1;
        if self.leases[s] == 1 {
            self.pinned_pages += self.pages[s];
            let pushed = self.pinned.push(task.slot);
            assert!(pushed.is_ok(), "one pinned entry per task slot");
        }
        Ok(AdapterLease {
            holder: req,
            task: SlotPlusOne::of(task),
            bomb: Bomb::armed(),
        })
    }

    /// Returns `req`'s lease. With `pause` the request stays registered as paused on the task and gets a
    /// [`PausedOn`] back; without, it is done with the task.
    pub(crate) fn release<K: KvBackend>(
        &mut self,
        kv: &mut K,
        req: RequestId,
        lease: AdapterLease,
        pause: bool,
    ) -> Option<PausedOn> {
        assert_eq!(lease.holder, req, "a lease is returned by its own request");
        let task = self.task_ref(lease.task.slot());
        lease.bomb.defuse();
        let s = task.slot.index();
        self.backend
            .mark_request_done(req, task, pause, AdapterHold::Lease);
        if let Some(a) = kv.adapters() {
            a.unpin_adapter(task.slot);
        }
        assert!(self.leases[s] > 0, "a returned lease was counted");
        self.leases[s] -= 1;
        if self.leases[s] == 0 {
            self.pinned_pages -= self.pages[s];
            let i = self.pinned.iter().position(|&x| x == task.slot);
            assert!(i.is_some(), "a leased task is pinned");
            if let Some(i) = i {
                self.pinned.swap_remove(i);
            }
        }
        pause.then(|| PausedOn {
            holder: req,
            task: SlotPlusOne::of(task),
            bomb: Bomb::armed(),
        })
    }

    /// Drops `req`'s paused registration (the request finished or was cancelled while paused).
    pub(crate) fn drop_paused(&mut self, req: RequestId, paused: PausedOn) {
        assert_eq!(
            paused.holder, req,
            "a paused registration is dropped by its own request"
        );
        let task = self.task_ref(paused.task.slot());
        paused.bomb.defuse();
        self.backend
            .mark_request_done(req, task, false, AdapterHold::Paused);
    }

    /// Makes the batch's adapters resident (see [`PeftBackend::ensure_batch`]).
    pub(crate) fn ensure_batch(
        &mut self,
        tasks: &[TaskRef],
        load: &mut dyn FnMut(TaskRef),
    ) -> Result<(), PeftError> {
        self.backend.ensure_batch(tasks, load)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapter_pool::AdapterPool;

    #[test]
    fn leases_pin_their_task_until_the_last_one_returns() {
        let mut pool: AdapterPool<4> = AdapterPool::new(4, 8).unwrap();
        let a = pool.register(TaskId(1), 3).unwrap();
        let mut desk: AdapterDesk<_, 4> = AdapterDesk::new(pool);
        let mut mem = crate::testing::Small::new();
        let kv = &mut mem.pool(0, 4);
        let l0 = desk.acquire(kv, RequestId(0), a, None).unwrap();
        let l1 = desk.acquire(kv, RequestId(1), a, None).unwrap();
        assert_eq!(desk.pinned_pages(), 3, "an adapter is pinned once");
        assert_eq!(desk.pinned_tasks(), &[a.slot]);
        assert_eq!(l0.holder(), RequestId(0));
        let p = desk.release(kv, RequestId(0), l0, true).unwrap();
        assert_eq!((desk.pinned_pages(), desk.leases(a.slot)), (3, 1));
        assert!(desk.release(kv, RequestId(1), l1, false).is_none());
        assert_eq!((desk.pinned_pages(), desk.leases(a.slot)), (0, 0));
        assert!(desk.pinned_tasks().is_empty());
        // The paused registration resumes into a lease of the same request.
        let l0 = desk.acquire(kv, RequestId(0), a, Some(p)).unwrap();
        assert_eq!(desk.backend().tasks()[0].paused, 0);
        assert!(desk.release(kv, RequestId(0), l0, false).is_none());
        assert_eq!(desk.backend().tasks()[0].active, 0);
    }

    #[test]
    #[should_panic(expected = "returned by its own request")]
    fn a_lease_returned_by_another_request_is_caught() {
        let mut pool: AdapterPool<4> = AdapterPool::new(4, 8).unwrap();
        let a = pool.register(TaskId(1), 1).unwrap();
        let mut desk: AdapterDesk<_, 4> = AdapterDesk::new(pool);
        let mut mem = crate::testing::Small::new();
        let kv = &mut mem.pool(0, 4);
        let l = desk.acquire(kv, RequestId(7), a, None).unwrap();
        let _ = desk.release(kv, RequestId(8), l, false);
    }
}
