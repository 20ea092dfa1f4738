//! Adapter leases and the desk that mints and consumes them.
//!
//! An [`AdapterLease`] is the proof that one request holds device ownership of one adapter. It is not
//! `Clone`/`Copy`, its constructor is private, and only the [`AdapterDesk`] creates (`acquire`) and
//! consumes (`release`) it. A [`PausedOn`] token is the proof that a request is registered as *paused* on
//! an adapter (its host copy stays pinned for a resume or a replay).
//!
//! Invariant (asserted by [`AdapterDesk::leases`] users and the property tests): for every task, the
//! number of live leases equals the backend's device refcount (`active`).
//!
//! The desk also keeps the per-pass PEFT page budget (DESIGN.md §3 point 6): every adapter pinned by a
//! lease holder at the start of a pass is counted, scheduled or not; a pinned task whose last lease is
//! returned during the pass and that no scheduled request uses is un-counted again.

use crate::adapter::{Holding, PeftBackend, TaskRef};
use crate::error::PeftError;
use crate::request::{Bomb, RequestId};

/// Device ownership of one adapter by one request. Minted and consumed only by [`AdapterDesk`].
#[must_use = "a lease must be returned to the adapter desk"]
#[derive(Debug)]
pub struct AdapterLease {
    task: TaskRef,
    _bomb: Bomb,
}

impl AdapterLease {
    /// The task this lease pins.
    pub fn task(&self) -> TaskRef {
        self.task
    }
}

/// A paused registration of a request on an adapter. Minted and consumed only by [`AdapterDesk`].
#[must_use = "a paused registration must be resumed or dropped through the adapter desk"]
#[derive(Debug)]
pub struct PausedOn {
    task: TaskRef,
    _bomb: Bomb,
}

impl PausedOn {
    /// The task the request is paused on.
    pub fn task(&self) -> TaskRef {
        self.task
    }
}

static_assertions::assert_not_impl_any!(AdapterLease: Clone, Copy, Default);
static_assertions::assert_not_impl_any!(PausedOn: Clone, Copy, Default);

/// Mints and consumes leases over a [`PeftBackend`] with `T` task slots, and keeps the PEFT page budget.
#[derive(Debug)]
pub struct AdapterDesk<P, const T: usize> {
    backend: P,
    leases: [u32; T],
    pages: [u32; T],
    pinned: heapless::Vec<u16, T>,
    pinned_pages: u32,
    // Per-pass budget state (epoch-stamped, so nothing is reset per pass).
    epoch: u32,
    counted: [u32; T],
    scheduled: [u32; T],
    claimed: u32,
}

impl<P: PeftBackend, const T: usize> AdapterDesk<P, T> {
    /// A desk over `backend`.
    pub fn new(backend: P) -> Self {
        Self {
            backend,
            leases: [0; T],
            pages: [0; T],
            pinned: heapless::Vec::new(),
            pinned_pages: 0,
            epoch: 0,
            counted: [0; T],
            scheduled: [0; T],
            claimed: 0,
        }
    }

    /// The backend.
    pub fn backend(&self) -> &P {
        &self.backend
    }

    /// The backend, mutably (for registration and inspection; leases stay with the desk).
    pub fn backend_mut(&mut self) -> &mut P {
        &mut self.backend
    }

    /// Live leases on a task slot.
    pub fn leases(&self, slot: u16) -> u32 {
        self.leases.get(slot as usize).copied().unwrap_or(0)
    }

    /// Feeds the desk's own state (lease counts, page counts, pinned set, pass budget) to `h`; the
    /// backend is not included.
    pub fn hash_state<H: core::hash::Hasher>(&self, h: &mut H) {
        use core::hash::Hash;
        self.leases.hash(h);
        self.pages.hash(h);
        self.pinned.hash(h);
        self.pinned_pages.hash(h);
        self.epoch.hash(h);
        self.counted.hash(h);
        self.scheduled.hash(h);
        self.claimed.hash(h);
    }

    /// Pages pinned on the device by lease holders.
    pub fn pinned_pages(&self) -> u32 {
        self.pinned_pages
    }

    /// Task slots with at least one lease.
    pub fn pinned_tasks(&self) -> &[u16] {
        &self.pinned
    }

    fn pages_of(&mut self, req: RequestId, task: TaskRef) -> u32 {
        let s = task.slot as usize;
        if self.pages[s] == 0 {
            self.pages[s] = self.backend.determine_num_pages(req, task);
        }
        self.pages[s]
    }

    fn slot_ok(task: TaskRef) -> Result<usize, PeftError> {
        let s = task.slot as usize;
        if s < T {
            Ok(s)
        } else {
            Err(PeftError::TaskTableFull)
        }
    }

    /// Registers `req` as active on `task` and mints its lease. `paused`: the request's paused
    /// registration, consumed on success (this is a resume or replay). On refusal everything is handed
    /// back unchanged.
    pub fn acquire(
        &mut self,
        req: RequestId,
        task: TaskRef,
        paused: Option<PausedOn>,
    ) -> Result<AdapterLease, (Option<PausedOn>, PeftError)> {
        let s = match Self::slot_ok(task) {
            Ok(s) => s,
            Err(e) => return Err((paused, e)),
        };
        debug_assert!(paused.as_ref().is_none_or(|p| p.task == task));
        if let Err(e) = self.backend.add_request(req, task, paused.is_some()) {
            return Err((paused, e));
        }
        if let Some(p) = paused {
            p._bomb.defuse();
        }
        let pages = self.pages_of(req, task);
        self.leases[s] += 1;
        if self.leases[s] == 1 {
            self.pinned_pages += pages;
            let pushed = self.pinned.push(task.slot);
            debug_assert!(pushed.is_ok());
        }
        Ok(AdapterLease {
            task,
            _bomb: Bomb::armed(),
        })
    }

    /// Returns a lease. With `pause` the request stays registered as paused on the task and gets a
    /// [`PausedOn`] back; without, it is done with the task.
    pub fn release(
        &mut self,
        req: RequestId,
        lease: AdapterLease,
        pause: bool,
    ) -> Option<PausedOn> {
        let task = lease.task;
        lease._bomb.defuse();
        let s = task.slot as usize;
        self.backend
            .mark_request_done(req, task, pause, Holding::Lease);
        debug_assert!(self.leases[s] > 0);
        self.leases[s] -= 1;
        if self.leases[s] == 0 {
            let pages = self.pages[s];
            self.pinned_pages -= pages;
            if let Some(i) = self.pinned.iter().position(|&x| x == task.slot) {
                self.pinned.swap_remove(i);
            }
            // Counted only because it was pinned, and no scheduled request uses it: un-count.
            if self.counted[s] == self.epoch && self.scheduled[s] != self.epoch {
                self.counted[s] = 0;
                self.claimed -= pages;
            }
        }
        pause.then(|| PausedOn {
            task,
            _bomb: Bomb::armed(),
        })
    }

    /// Drops a paused registration (the request finished or was cancelled while paused).
    pub fn drop_paused(&mut self, req: RequestId, paused: PausedOn) {
        let task = paused.task;
        paused._bomb.defuse();
        self.backend
            .mark_request_done(req, task, false, Holding::Paused);
    }

    /// Starts a pass's PEFT budget: every pinned adapter is counted.
    pub fn begin_pass(&mut self) {
        self.epoch = self.epoch.wrapping_add(1).max(1);
        self.claimed = self.pinned_pages;
        for &s in self.pinned.iter() {
            self.counted[s as usize] = self.epoch;
        }
    }

    /// Pages this request's adapter adds to the pass (0 when already counted), or `None` when it does
    /// not fit in the device cache next to what is counted.
    #[inline]
    pub fn pages_needed(&mut self, req: RequestId, task: TaskRef) -> Option<u32> {
        let s = task.slot as usize;
        if s >= T {
            return None;
        }
        if self.counted[s] == self.epoch {
            return Some(0);
        }
        let pages = self.backend.determine_num_pages(req, task);
        self.pages[s] = pages;
        if self.claimed as u64 + pages as u64 > self.backend.max_device_pages() as u64 {
            None
        } else {
            Some(pages)
        }
    }

    /// The task's pages are counted in this pass's budget.
    pub fn is_counted(&self, task: TaskRef) -> bool {
        self.counted.get(task.slot as usize) == Some(&self.epoch)
    }

    /// Commits a scheduled request's adapter to the pass. Returns true the first time the task is
    /// scheduled in this pass (so the caller can list it in the adapter plan).
    #[inline]
    pub fn commit(&mut self, task: TaskRef, pages: u32) -> bool {
        let s = task.slot as usize;
        if self.counted[s] != self.epoch {
            self.counted[s] = self.epoch;
            self.claimed += pages;
        }
        let first = self.scheduled[s] != self.epoch;
        self.scheduled[s] = self.epoch;
        first
    }

    /// [`Self::commit`] for a task already counted in this pass (an active request's: pinned by its
    /// lease), which adds no pages.
    #[inline]
    pub fn commit_counted(&mut self, task: TaskRef) -> bool {
        let s = task.slot as usize;
        debug_assert!(self.counted[s] == self.epoch, "the task is counted");
        let first = self.scheduled[s] != self.epoch;
        self.scheduled[s] = self.epoch;
        first
    }

    /// Pages claimed so far in this pass.
    pub fn claimed(&self) -> u32 {
        self.claimed
    }

    /// Makes the batch's adapters resident (see [`PeftBackend::ensure_batch`]).
    pub fn ensure_batch(
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
    use crate::adapter::AdapterPool;
    use crate::request::TaskId;

    #[test]
    fn pinned_adapters_count_until_their_last_lease_returns() {
        let mut pool: AdapterPool<4> = AdapterPool::new(4, 8).unwrap();
        let a = pool.register(TaskId(1), 3).unwrap();
        let b = pool.register(TaskId(2), 2).unwrap();
        let mut desk: AdapterDesk<_, 4> = AdapterDesk::new(pool);
        let l0 = desk.acquire(RequestId(0), a, None).unwrap();
        let l1 = desk.acquire(RequestId(1), a, None).unwrap();
        assert_eq!(desk.pinned_pages(), 3, "an adapter is pinned once");
        desk.begin_pass();
        assert_eq!(desk.claimed(), 3);
        assert_eq!(
            desk.pages_needed(RequestId(0), a),
            Some(0),
            "counted: already pinned"
        );
        assert_eq!(
            desk.pages_needed(RequestId(2), b),
            None,
            "3 + 2 > 4 device pages"
        );
        // One of two leases returned: still pinned.
        let p = desk.release(RequestId(0), l0, true).unwrap();
        assert_eq!(desk.claimed(), 3);
        // The last lease returned and nothing scheduled uses the task: un-counted, b now fits.
        assert!(desk.release(RequestId(1), l1, false).is_none());
        assert_eq!((desk.claimed(), desk.pinned_pages()), (0, 0));
        assert_eq!(desk.pages_needed(RequestId(2), b), Some(2));
        assert!(desk.commit(b, 2));
        assert!(!desk.commit(b, 0), "listed once per pass");
        // A scheduled task stays counted when its last lease goes.
        let l2 = desk.acquire(RequestId(2), b, None).unwrap();
        let _ = desk.release(RequestId(2), l2, false);
        assert_eq!(desk.claimed(), 2);
        desk.drop_paused(RequestId(0), p);
        assert_eq!(desk.backend().tasks()[0].paused, 0);
    }
}
