//! The adapter binding: LoRA weights in host pages, uploaded into device pages when the core's
//! adapter plan says so.

use kvsched_core::adapter::{HostChange, TaskRef};
use kvsched_core::ids::{RequestId, TaskSlot};
use kvsched_core::kv::{PageMove, Tier};
use kvsched_core::storage::Storage;
use kvsched_core::{AdapterPool, SchedulerOutput};

use crate::error::MemError;
use crate::page::{AdapterMemory, AdapterShape, CopyEvent};

/// The engine's source of adapter weights: fills the buffer (`pages * page_bytes` bytes, zeroed) with
/// the task's weights, for [`AdapterSlots::apply_host_changes`].
pub type WeightSource<'a> = dyn FnMut(TaskRef, &mut [u8]) -> Result<(), MemError> + 'a;

/// What [`AdapterSlots::apply`] did for one adapter plan.
#[derive(Debug)]
#[must_use = "wait on the event before the batch's kernels read the uploaded adapters"]
pub struct AdapterUploads {
    /// Adapters dropped from the device (no copy: their pages were only freed).
    pub evicted: u32,
    /// Adapters uploaded.
    pub loaded: u32,
    /// Pages uploaded.
    pub pages: u32,
    /// Completion of the upload (complete at once when nothing was loaded).
    pub event: CopyEvent,
}

/// Counters of an [`AdapterSlots`] binding over its lifetime.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdapterSlotStats {
    /// Adapters uploaded to the device.
    pub loads: u64,
    /// Adapters dropped from the device.
    pub evictions: u64,
    /// Pages uploaded.
    pub pages_uploaded: u64,
    /// `upload_adapter` calls (one per plan with loads).
    pub uploads: u64,
    /// Host copies written (weights fetched into host pages).
    pub host_fills: u64,
    /// Host copies dropped (their host pages freed).
    pub host_drops: u64,
}

/// Where one registered adapter lives.
#[derive(Debug)]
struct Placement {
    task: TaskRef,
    pages: u32,
    /// Host pages holding its weights, in weight-page order; empty when it has no host copy.
    host: Vec<u32>,
    /// Device pages, in weight-page order; empty when it is not on the device.
    device: Vec<u32>,
}

/// Places LoRA adapters in the pages of an [`AdapterMemory`] store, following the core's adapter
/// cache on both tiers.
///
/// Host: a task registered with [`AdapterSlots::register_task`] has host pages only while the core
/// keeps a host copy of it. The core loads an adapter into host pages when a request acquires its
/// lease and evicts host copies that nobody holds or is paused on when it needs room;
/// [`Scheduler::take_adapter_host_changes`] reports both, and [`AdapterSlots::apply_host_changes`]
/// frees the pages of dropped copies and writes the weights of new ones (fetched from the engine's
/// own source, a file or CPU memory, through a callback) into pages of a free list. The core's host
/// budget ([`AdapterPool`]'s host pages) bounds the copies, so a store with at least that many host
/// pages always holds them.
///
/// Device: per task slot, the device pages it occupies while resident, taken from a free list of
/// the store's device pages. [`AdapterSlots::apply`] takes a plan — the adapters the core evicted
/// from the device ([`Scheduler::take_adapter_evictions`]) and the adapters it loaded
/// ([`SchedulerOutput::adapter_loads`]) — and first frees the evicted adapters' pages (no copy:
/// eviction only makes pages reusable), then gives each loaded adapter pages from the free list
/// and uploads its host pages into them, all loads in one `upload_adapter` call. The core sized
/// the plan to its device pages, so with a store of at least that many device pages the loads
/// always fit. [`AdapterSlots::apply_plan`] does the same after checking the plan against the
/// core's adapter cache.
///
/// The upload's moves are kvsched-core [`PageMove`]s `from` [`Tier::Host`] (`src` a host page,
/// `dst` a device page). An adapter copy belongs to no request: its `request` field is unused by
/// the stores and set to the task id (`RequestId(task.id.0)`), for tracing only.
///
/// The upload may overwrite pages an evicted adapter had: kernels of an earlier step that still
/// read them must be done before the upload starts (make the store's copy stream wait on the
/// previous step, or synchronise).
///
/// [`Scheduler::take_adapter_evictions`]: kvsched_core::Scheduler::take_adapter_evictions
/// [`Scheduler::take_adapter_host_changes`]: kvsched_core::Scheduler::take_adapter_host_changes
#[derive(Debug)]
pub struct AdapterSlots {
    shape: AdapterShape,
    /// Free device pages, popped from the end (low ids first at the start).
    device_free: Vec<u32>,
    /// Free host pages, popped from the end (low ids first at the start).
    host_free: Vec<u32>,
    /// Placements by the core's task slot.
    tasks: Vec<Option<Placement>>,
    moves: Vec<PageMove>,
    scratch: Vec<u8>,
    stats: AdapterSlotStats,
}

impl AdapterSlots {
    /// Slots over a store of shape `shape` (every page free, no task registered).
    pub fn new(shape: AdapterShape) -> Result<Self, MemError> {
        shape.validate()?;
        Ok(Self {
            shape,
            device_free: (0..shape.gpu_pages).rev().collect(),
            host_free: (0..shape.host_pages).rev().collect(),
            tasks: Vec::new(),
            moves: Vec::new(),
            scratch: Vec::new(),
            stats: AdapterSlotStats::default(),
        })
    }

    /// The store shape these slots place pages in.
    pub fn shape(&self) -> AdapterShape {
        self.shape
    }

    /// Pages that `bytes` bytes of weights occupy (at least one).
    pub fn pages_for(&self, bytes: usize) -> u32 {
        let pages = bytes.div_ceil(self.shape.page_bytes).max(1);
        u32::try_from(pages).unwrap_or(u32::MAX)
    }

    fn check_store<S: AdapterMemory + ?Sized>(&self, store: &S) -> Result<(), MemError> {
        if store.shape() == self.shape {
            Ok(())
        } else {
            Err(MemError::InvalidShape {
                reason: "the store's shape differs from the adapter slots' shape",
            })
        }
    }

    /// Registers task `task` (as [`AdapterPool::register`] returned it) with `pages` pages of
    /// weights, the count given to the core. Nothing is written: the weights go into host pages when
    /// the core loads the adapter there ([`AdapterSlots::apply_host_changes`]).
    ///
    /// Refuses (changing nothing): a slot already registered, zero pages.
    pub fn register_task(&mut self, task: TaskRef, pages: u32) -> Result<(), MemError> {
        let slot = usize::from(task.slot);
        if self.tasks.get(slot).is_some_and(Option::is_some) {
            return Err(MemError::AdapterPlan {
                slot: task.slot,
                reason: "task slot already registered",
            });
        }
        if pages == 0 {
            return Err(MemError::AdapterPlan {
                slot: task.slot,
                reason: "an adapter occupies at least one page",
            });
        }
        if self.tasks.len() <= slot {
            self.tasks.resize_with(slot + 1, || None);
        }
        self.tasks[slot] = Some(Placement {
            task,
            pages,
            host: Vec::with_capacity(pages as usize),
            device: Vec::with_capacity(pages as usize),
        });
        Ok(())
    }

    /// Forgets a retired task's placement (the core's [`AdapterPool::retire`], its drops applied), so
    /// its slot can be registered again. Refuses (changing nothing): an unregistered slot, or one whose
    /// copy still holds host or device pages.
    ///
    /// [`AdapterPool::retire`]: kvsched_core::AdapterPool::retire
    pub fn unregister_task(&mut self, task: TaskRef) -> Result<(), MemError> {
        let slot = usize::from(task.slot);
        let refuse = |reason| MemError::AdapterPlan {
            slot: task.slot,
            reason,
        };
        let placement = self
            .tasks
            .get(slot)
            .and_then(Option::as_ref)
            .ok_or_else(|| refuse("task slot not registered"))?;
        if !placement.host.is_empty() || !placement.device.is_empty() {
            return Err(refuse("a retired task still holds pages"));
        }
        self.tasks[slot] = None;
        Ok(())
    }

    /// Follows the core's host tier: `changes` as [`Scheduler::take_adapter_host_changes`] handed
    /// them over. First frees the host pages of every dropped or replaced copy, then, for every filled
    /// or replaced one, takes free host pages and writes the task's weights there: `weights(task,
    /// buf)` fills `buf` (`pages * page_bytes` bytes, zeroed) from the engine's own source. Returns
    /// the pages written. Call it before [`AdapterSlots::apply_plan`], whose uploads read the host
    /// copies.
    ///
    /// Refuses, changing nothing: an unregistered task, a drop of a copy the slots do not hold, a fill
    /// of one they do (`AdapterPlan`), copies that do not fit the free host pages (`OutOfPages`), a
    /// store of another shape. An error from `weights` or from the store is returned as is; the copy
    /// being written is then not kept (its pages go back to the free list).
    ///
    /// [`Scheduler::take_adapter_host_changes`]: kvsched_core::Scheduler::take_adapter_host_changes
    pub fn apply_host_changes<S: AdapterMemory + ?Sized>(
        &mut self,
        store: &mut S,
        changes: &[(TaskRef, HostChange)],
        weights: &mut WeightSource<'_>,
    ) -> Result<u32, MemError> {
        self.check_store(store)?;
        let refuse = |task: &TaskRef, reason| MemError::AdapterPlan {
            slot: task.slot,
            reason,
        };
        let (mut freed, mut needed) = (0u32, 0u32);
        for (i, (task, change)) in changes.iter().enumerate() {
            let placement = self.placement(*task)?;
            if changes[..i].iter().any(|(t, _)| t.slot == task.slot) {
                return Err(refuse(task, "host change named twice"));
            }
            let held = !placement.host.is_empty();
            match change {
                HostChange::Dropped | HostChange::Replaced if !held => {
                    return Err(refuse(task, "host copy dropped but not held"));
                }
                HostChange::Filled if held => {
                    return Err(refuse(task, "host copy filled but already held"));
                }
                HostChange::Dropped => freed += placement.pages,
                HostChange::Filled => needed = needed.saturating_add(placement.pages),
                HostChange::Replaced => {
                    freed += placement.pages;
                    needed = needed.saturating_add(placement.pages);
                }
            }
        }
        // Lossless: the free list holds at most `host_pages` (a u32) entries.
        let free = self.host_free.len() as u32 + freed;
        if needed > free {
            return Err(MemError::OutOfPages {
                tier: Tier::Host,
                needed,
                free,
            });
        }
        for (task, change) in changes {
            if matches!(change, HostChange::Dropped | HostChange::Replaced) {
                if let Some(Some(placement)) = self.tasks.get_mut(usize::from(task.slot)) {
                    self.host_free.extend(placement.host.drain(..).rev());
                    self.stats.host_drops += 1;
                }
            }
        }
        let mut written = 0;
        for (task, change) in changes {
            if matches!(change, HostChange::Filled | HostChange::Replaced) {
                written += self.fill_host(store, *task, weights)?;
            }
        }
        Ok(written)
    }

    /// Writes `task`'s weights into free host pages (counted free by the caller).
    fn fill_host<S: AdapterMemory + ?Sized>(
        &mut self,
        store: &mut S,
        task: TaskRef,
        weights: &mut WeightSource<'_>,
    ) -> Result<u32, MemError> {
        let page_bytes = self.shape.page_bytes;
        let Some(Some(placement)) = self.tasks.get_mut(usize::from(task.slot)) else {
            return Ok(0);
        };
        let pages = placement.pages;
        if self.host_free.len() < pages as usize {
            return Err(MemError::OutOfPages {
                tier: Tier::Host,
                needed: pages,
                free: self.host_free.len() as u32,
            });
        }
        self.scratch.clear();
        self.scratch.resize(pages as usize * page_bytes, 0);
        let mut result = weights(task, &mut self.scratch);
        // The pages off the free list's end, into the placement's kept buffer: no allocation.
        let first = self.host_free.len() - pages as usize;
        debug_assert!(
            placement.host.is_empty(),
            "the caller dropped any older copy"
        );
        placement.host.extend(self.host_free.drain(first..).rev());
        if result.is_ok() {
            for (&page, data) in placement
                .host
                .iter()
                .zip(self.scratch.chunks_exact(page_bytes))
            {
                if let Err(e) = store.write_page(Tier::Host, page, data) {
                    result = Err(e);
                    break;
                }
            }
        }
        match result {
            Ok(()) => {
                self.stats.host_fills += 1;
                Ok(pages)
            }
            Err(e) => {
                self.host_free.extend(placement.host.drain(..).rev());
                Err(e)
            }
        }
    }

    fn placement(&self, task: TaskRef) -> Result<&Placement, MemError> {
        match self.tasks.get(usize::from(task.slot)) {
            Some(Some(placement)) if placement.task.id == task.id => Ok(placement),
            Some(Some(_)) => Err(MemError::AdapterPlan {
                slot: task.slot,
                reason: "the slot is registered to another task id",
            }),
            _ => Err(MemError::AdapterPlan {
                slot: task.slot,
                reason: "task not registered with the adapter slots",
            }),
        }
    }

    /// Applies the plan of one `ensure_batch`: the adapters the core evicted from the device
    /// (`evicted`, as [`Scheduler::take_adapter_evictions`] handed them over) and
    /// [`out.adapter_loads()`](SchedulerOutput::adapter_loads). Checks that every adapter in them
    /// has the page count `pool` (the core's adapter cache, `sched.adapters().backend()`) gives it,
    /// then [`applies`](AdapterSlots::apply) them; all-or-nothing.
    ///
    /// Call it after every `Scheduler::ensure_batch` (the core's eviction log holds one pass's
    /// worth):
    ///
    /// ```text
    /// evicted.clear();                                   // a Vec<TaskRef> kept across iterations
    /// sched.take_adapter_evictions(|task| evicted.push(task));
    /// let loaded = slots.apply_plan(&mut store, sched.adapters().backend(), &evicted, &out)?;
    /// ```
    ///
    /// [`Scheduler::take_adapter_evictions`]: kvsched_core::Scheduler::take_adapter_evictions
    pub fn apply_plan<S: AdapterMemory + ?Sized, const T: usize, const N: usize, St: Storage>(
        &mut self,
        store: &mut S,
        pool: &AdapterPool<T>,
        evicted: &[TaskRef],
        out: &SchedulerOutput<N, St>,
    ) -> Result<AdapterUploads, MemError> {
        self.apply_checked(store, pool, evicted, out.adapter_loads())
    }

    /// [`AdapterSlots::apply`] after checking the page counts against the core's adapter cache.
    fn apply_checked<S: AdapterMemory + ?Sized, const T: usize>(
        &mut self,
        store: &mut S,
        pool: &AdapterPool<T>,
        evicted: &[TaskRef],
        loads: &[TaskRef],
    ) -> Result<AdapterUploads, MemError> {
        for task in evicted.iter().chain(loads) {
            let core_pages = pool.tasks().get(usize::from(task.slot)).map(|t| t.pages);
            if core_pages != Some(self.placement(*task)?.pages) {
                return Err(MemError::AdapterPlan {
                    slot: task.slot,
                    reason: "page count differs from the core adapter cache's",
                });
            }
        }
        self.apply(store, evicted, loads)
    }

    /// Applies an adapter plan: frees the device pages of `evicted` (no copy), then places each of
    /// `loads` in free device pages and uploads its host pages there, in one `upload_adapter` call.
    ///
    /// All-or-nothing: refuses, changing nothing, an unregistered task, an eviction of an adapter
    /// that is not resident, a load of one that is (unless this plan evicts it), a task named twice
    /// in a list (`AdapterPlan`), loads that do not fit the free pages (`OutOfPages`), a store of
    /// another shape.
    pub fn apply<S: AdapterMemory + ?Sized>(
        &mut self,
        store: &mut S,
        evicted: &[TaskRef],
        loads: &[TaskRef],
    ) -> Result<AdapterUploads, MemError> {
        self.check_store(store)?;
        let refuse = |task: &TaskRef, reason| MemError::AdapterPlan {
            slot: task.slot,
            reason,
        };
        let mut freed = 0u32;
        for (i, task) in evicted.iter().enumerate() {
            let placement = self.placement(*task)?;
            if placement.device.is_empty() {
                return Err(refuse(task, "evicted but not on the device"));
            }
            if evicted[..i].iter().any(|t| t.slot == task.slot) {
                return Err(refuse(task, "evicted twice in one plan"));
            }
            freed += placement.pages;
        }
        let mut needed = 0u32;
        for (i, task) in loads.iter().enumerate() {
            let placement = self.placement(*task)?;
            let evicting = evicted.iter().any(|t| t.slot == task.slot);
            if !placement.device.is_empty() && !evicting {
                return Err(refuse(task, "loaded but already on the device"));
            }
            if loads[..i].iter().any(|t| t.slot == task.slot) {
                return Err(refuse(task, "loaded twice in one plan"));
            }
            if placement.host.is_empty() {
                return Err(refuse(task, "loaded on the device without a host copy"));
            }
            needed = needed.saturating_add(placement.pages);
        }
        // Lossless: the free list holds at most `gpu_pages` (a u32) entries.
        let free = self.device_free.len() as u32 + freed;
        if needed > free {
            return Err(MemError::OutOfPages {
                tier: Tier::Gpu,
                needed,
                free,
            });
        }

        // Evictions: the pages go back in reverse, so a later load takes them in the same order.
        for task in evicted {
            if let Some(Some(placement)) = self.tasks.get_mut(usize::from(task.slot)) {
                self.device_free.extend(placement.device.drain(..).rev());
            }
        }
        self.moves.clear();
        for task in loads {
            if let Some(Some(placement)) = self.tasks.get_mut(usize::from(task.slot)) {
                for index in 0..placement.pages {
                    // Checked above: the free list holds at least `needed` pages.
                    let Some(page) = self.device_free.pop() else {
                        break;
                    };
                    placement.device.push(page);
                    self.moves.push(PageMove {
                        // Unused by the stores: the task id, for tracing (see the type's docs).
                        request: RequestId(task.id.0),
                        from: Tier::Host,
                        src: placement.host[index as usize],
                        dst: page,
                    });
                }
            }
        }
        let event = if self.moves.is_empty() {
            CopyEvent::complete()
        } else {
            let event = store.upload_adapter(&self.moves)?;
            self.stats.uploads += 1;
            event
        };
        let pages = self.moves.len() as u32;
        self.stats.evictions += evicted.len() as u64;
        self.stats.loads += loads.len() as u64;
        self.stats.pages_uploaded += u64::from(pages);
        Ok(AdapterUploads {
            evicted: evicted.len() as u32,
            loaded: loads.len() as u32,
            pages,
            event,
        })
    }

    /// The device pages of the adapter in task slot `slot`, in weight-page order (page `i` of its
    /// weights at `device_pages(slot)[i]`); `None` when it is not on the device or not registered.
    pub fn device_pages(&self, slot: TaskSlot) -> Option<&[u32]> {
        match self.tasks.get(usize::from(slot)) {
            Some(Some(placement)) if !placement.device.is_empty() => Some(&placement.device),
            _ => None,
        }
    }

    /// The host pages holding the weights of the adapter in task slot `slot`, in weight-page order;
    /// `None` when it has no host copy or is not registered.
    pub fn host_pages(&self, slot: TaskSlot) -> Option<&[u32]> {
        match self.tasks.get(usize::from(slot)) {
            Some(Some(placement)) if !placement.host.is_empty() => Some(&placement.host),
            _ => None,
        }
    }

    /// Device pages free for loads.
    pub fn device_free(&self) -> u32 {
        // Lossless: at most `gpu_pages` entries.
        self.device_free.len() as u32
    }

    /// Host pages free for copies.
    pub fn host_free(&self) -> u32 {
        // Lossless: at most `host_pages` entries.
        self.host_free.len() as u32
    }

    /// Lifetime counters.
    pub fn stats(&self) -> AdapterSlotStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{HostAdapterStore, PageStore, PoolShape};
    use kvsched_core::ids::{TaskId, TaskSlot};

    const PAGE: usize = 4;

    fn task(slot: u16) -> TaskRef {
        TaskRef {
            id: TaskId(100 + u64::from(slot)),
            slot: TaskSlot(slot),
        }
    }

    fn device(store: &HostAdapterStore, page: u32) -> Vec<u8> {
        let mut out = vec![0; PAGE];
        store.read_page(Tier::Gpu, page, &mut out).unwrap();
        out
    }

    /// The engine's source of weights: task 0's are 1,1,1,1,2 (padded), task 1's twelve 3s, task 2's
    /// four 9s.
    #[allow(clippy::unnecessary_wraps)] // the binding's weight source returns a Result
    fn weights(task: TaskRef, buf: &mut [u8]) -> Result<(), MemError> {
        let w: &[u8] = match task.slot {
            TaskSlot(0) => &[1, 1, 1, 1, 2],
            TaskSlot(1) => &[3; 12],
            _ => &[9; 4],
        };
        buf[..w.len()].copy_from_slice(w);
        Ok(())
    }

    fn setup() -> (HostAdapterStore, AdapterSlots) {
        let shape = PoolShape::new(PAGE, 4, 6);
        let mut store = HostAdapterStore::new(shape).unwrap();
        let mut slots = AdapterSlots::new(shape).unwrap();
        assert_eq!(slots.pages_for(5), 2);
        slots.register_task(task(0), 2).unwrap();
        slots.register_task(task(1), 3).unwrap();
        assert_eq!(
            slots.host_pages(TaskSlot(0)),
            None,
            "registration writes nothing"
        );
        let changes = [(task(0), HostChange::Filled), (task(1), HostChange::Filled)];
        let written = slots
            .apply_host_changes(&mut store, &changes, &mut weights)
            .unwrap();
        assert_eq!(written, 5);
        assert_eq!(slots.host_pages(TaskSlot(0)), Some(&[0, 1][..]));
        assert_eq!(slots.host_pages(TaskSlot(1)), Some(&[2, 3, 4][..]));
        (store, slots)
    }

    #[test]
    fn loads_upload_weights_and_evictions_reuse_pages() {
        let (mut store, mut slots) = setup();
        let up = slots.apply(&mut store, &[], &[task(0)]).unwrap();
        assert_eq!((up.loaded, up.pages), (1, 2));
        assert_eq!(slots.device_pages(TaskSlot(0)), Some(&[0, 1][..]));
        assert_eq!(device(&store, 0), [1; 4]);
        assert_eq!(device(&store, 1), [2, 0, 0, 0], "zero-padded last page");
        assert_eq!(slots.device_free(), 2);
        // Task 1 needs 3 pages, 2 are free: the plan must evict task 0 first.
        assert_eq!(
            slots.apply(&mut store, &[], &[task(1)]).unwrap_err(),
            MemError::OutOfPages {
                tier: Tier::Gpu,
                needed: 3,
                free: 2
            }
        );
        let up = slots.apply(&mut store, &[task(0)], &[task(1)]).unwrap();
        assert_eq!((up.evicted, up.loaded, up.pages), (1, 1, 3));
        assert_eq!(slots.device_pages(TaskSlot(0)), None);
        assert_eq!(
            slots.device_pages(TaskSlot(1)),
            Some(&[0, 1, 2][..]),
            "evicted pages reused in order"
        );
        for page in 0..3 {
            assert_eq!(device(&store, page), [3; 4]);
        }
        assert_eq!(slots.stats().uploads, 2);
    }

    #[test]
    fn inconsistent_plans_change_nothing() {
        let (mut store, mut slots) = setup();
        let _ = slots.apply(&mut store, &[], &[task(0)]).unwrap();
        let unknown = TaskRef {
            id: TaskId(7),
            slot: TaskSlot(3),
        };
        let cases: [(&[TaskRef], &[TaskRef], &str); 5] = [
            (&[task(1)], &[], "evicted but not on the device"),
            (&[], &[task(0)], "loaded but already on the device"),
            (&[task(0), task(0)], &[], "evicted twice in one plan"),
            (&[task(0)], &[task(0), task(0)], "loaded twice in one plan"),
            (
                &[],
                &[unknown],
                "task not registered with the adapter slots",
            ),
        ];
        for (evicted, loads, reason) in cases {
            let error = slots.apply(&mut store, evicted, loads).unwrap_err();
            assert!(
                matches!(error, MemError::AdapterPlan { reason: r, .. } if r == reason),
                "{error}"
            );
            assert_eq!(slots.device_pages(TaskSlot(0)), Some(&[0, 1][..]));
            assert_eq!(slots.device_free(), 2);
        }
        // Evicted and loaded again in one plan: allowed.
        let up = slots.apply(&mut store, &[task(0)], &[task(0)]).unwrap();
        up.event.wait().unwrap();
        assert_eq!(slots.device_pages(TaskSlot(0)), Some(&[0, 1][..]));
    }

    #[test]
    fn registration_and_host_change_refusals() {
        let (mut store, mut slots) = setup();
        assert!(matches!(
            slots.register_task(task(1), 1),
            Err(MemError::AdapterPlan {
                slot: TaskSlot(1),
                ..
            })
        ));
        assert!(matches!(
            slots.register_task(task(2), 0),
            Err(MemError::AdapterPlan {
                slot: TaskSlot(2),
                ..
            })
        ));
        slots.register_task(task(2), 2).unwrap();
        let unknown = TaskRef {
            id: TaskId(7),
            slot: TaskSlot(3),
        };
        let cases: [(&[(TaskRef, HostChange)], &str); 4] = [
            (
                &[(task(2), HostChange::Dropped)],
                "host copy dropped but not held",
            ),
            (
                &[(task(0), HostChange::Filled)],
                "host copy filled but already held",
            ),
            (
                &[
                    (task(0), HostChange::Dropped),
                    (task(0), HostChange::Filled),
                ],
                "host change named twice",
            ),
            (
                &[(unknown, HostChange::Filled)],
                "task not registered with the adapter slots",
            ),
        ];
        for (changes, reason) in cases {
            let error = slots
                .apply_host_changes(&mut store, changes, &mut weights)
                .unwrap_err();
            assert!(
                matches!(error, MemError::AdapterPlan { reason: r, .. } if r == reason),
                "{error}"
            );
            assert_eq!(slots.host_free(), 1);
        }
        assert_eq!(
            slots.apply_host_changes(&mut store, &[(task(2), HostChange::Filled)], &mut weights),
            Err(MemError::OutOfPages {
                tier: Tier::Host,
                needed: 2,
                free: 1
            })
        );
        // A failing source keeps nothing.
        let mut broken =
            |_: TaskRef, _: &mut [u8]| -> Result<(), MemError> { Err(MemError::NoDriver) };
        let changes = [
            (task(0), HostChange::Dropped),
            (task(2), HostChange::Filled),
        ];
        assert_eq!(
            slots.apply_host_changes(&mut store, &changes, &mut broken),
            Err(MemError::NoDriver)
        );
        assert_eq!(slots.host_pages(TaskSlot(2)), None);
        assert_eq!(
            slots.host_free(),
            3,
            "task 0's copy was dropped, task 2's not kept"
        );
        // Dropped, its pages reused by the next copy; a device load needs a host copy.
        assert_eq!(
            slots
                .apply_host_changes(&mut store, &[(task(2), HostChange::Filled)], &mut weights)
                .unwrap(),
            2
        );
        assert_eq!(
            slots.host_pages(TaskSlot(2)),
            Some(&[0, 1][..]),
            "task 0's freed pages, in order"
        );
        assert!(matches!(
            slots.apply(&mut store, &[], &[task(0)]),
            Err(MemError::AdapterPlan {
                reason: "loaded on the device without a host copy",
                ..
            })
        ));
        let up = slots.apply(&mut store, &[], &[task(2)]).unwrap();
        assert_eq!(up.pages, 2);
        assert_eq!(device(&store, 0), [9; 4]);
        assert_eq!(device(&store, 1), [0; 4], "zero-padded");
        let mut other = HostAdapterStore::new(PoolShape::new(PAGE, 4, 7)).unwrap();
        assert!(matches!(
            slots.apply(&mut other, &[], &[]),
            Err(MemError::InvalidShape { .. })
        ));
    }

    #[test]
    fn plan_from_the_core_adapter_cache() {
        use kvsched_core::adapter::{AdapterHold, PeftBackend};
        let (mut store, mut slots) = setup();
        let mut pool: AdapterPool<4> = AdapterPool::new(4, 8).unwrap();
        let a = pool.register(TaskId(100), 2).unwrap();
        let b = pool.register(TaskId(101), 3).unwrap();
        assert_eq!((a, b), (task(0), task(1)));
        let (mut evicted, mut loads) = (Vec::new(), Vec::new());
        pool.add_request(RequestId(1), a, false).unwrap();
        pool.ensure_batch(&[a], &mut |t| loads.push(t)).unwrap();
        pool.take_device_evictions(&mut |t| evicted.push(t));
        let up = slots
            .apply_checked(&mut store, &pool, &evicted, &loads)
            .unwrap();
        assert_eq!((up.evicted, up.loaded), (0, 1));
        pool.mark_request_done(RequestId(1), a, false, AdapterHold::Lease);
        loads.clear();
        pool.add_request(RequestId(2), b, false).unwrap();
        pool.ensure_batch(&[b], &mut |t| loads.push(t)).unwrap();
        pool.take_device_evictions(&mut |t| evicted.push(t));
        assert_eq!(evicted, [a]);
        let up = slots
            .apply_checked(&mut store, &pool, &evicted, &loads)
            .unwrap();
        assert_eq!((up.evicted, up.loaded, up.pages), (1, 1, 3));
        assert_eq!(slots.device_free(), 4 - pool.device_used());
        // The upload's moves: host pages of task 1 to the device, tagged with its task id.
        assert!(slots
            .moves
            .iter()
            .all(|m| m.from == Tier::Host && m.request == RequestId(101)));
        let srcs: Vec<u32> = slots.moves.iter().map(|m| m.src).collect();
        assert_eq!(srcs, [2, 3, 4]);
        // A page count that differs from the core's is refused, changing nothing.
        let c = pool.register(TaskId(102), 2).unwrap();
        slots.register_task(c, 1).unwrap();
        slots
            .apply_host_changes(&mut store, &[(c, HostChange::Filled)], &mut weights)
            .unwrap();
        let free = slots.device_free();
        assert!(matches!(
            slots.apply_checked(&mut store, &pool, &[], &[c]),
            Err(MemError::AdapterPlan {
                slot: TaskSlot(2),
                ..
            })
        ));
        assert_eq!(slots.device_free(), free);
        assert_eq!(slots.device_pages(TaskSlot(2)), None);
    }
}
