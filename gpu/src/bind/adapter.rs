//! The adapter binding: LoRA weights in host pages, uploaded into device pages when the core's
//! adapter plan says so.

use core::ops::Range;

use kvsched_core::adapter::TaskRef;
use kvsched_core::kv::{PageMove, Tier};
use kvsched_core::request::RequestId;
use kvsched_core::{AdapterPool, SchedulerOutput};

use crate::error::MemError;
use crate::page::{AdapterMemory, AdapterShape, CopyEvent};

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
}

/// Where one registered adapter lives.
#[derive(Debug)]
struct Placement {
    task: TaskRef,
    /// Its weights: `pages` host pages from `host_first`.
    host_first: u32,
    pages: u32,
    /// Device pages, in weight-page order; empty when it is not on the device.
    device: Vec<u32>,
}

/// Places LoRA adapters in the pages of an [`AdapterMemory`] store, following the core's adapter
/// plan.
///
/// Host: every task registered with [`AdapterSlots::register_task`] gets its own contiguous run of
/// host pages holding its weights, for good (the core has no unregistration). The core's host-tier
/// budget ([`AdapterPool`]'s host pages) is accounting: size the store's host tier for every
/// registered adapter.
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
#[derive(Debug)]
pub struct AdapterSlots {
    shape: AdapterShape,
    /// Free device pages, popped from the end (low ids first at the start).
    device_free: Vec<u32>,
    /// Host pages handed out so far (pages `0..host_used`).
    host_used: u32,
    /// Placements by the core's task slot.
    tasks: Vec<Option<Placement>>,
    moves: Vec<PageMove>,
    scratch: Vec<u8>,
    stats: AdapterSlotStats,
}

impl AdapterSlots {
    /// Slots over a store of shape `shape` (every device page free, no task registered).
    pub fn new(shape: AdapterShape) -> Result<Self, MemError> {
        shape.validate()?;
        Ok(Self {
            shape,
            device_free: (0..shape.gpu_pages).rev().collect(),
            host_used: 0,
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
    /// weights — the count given to the core — and writes `weights` into fresh host pages of
    /// `store`, zero-padded to `pages` pages.
    ///
    /// Refuses (changing nothing): a slot already registered, zero pages, weights longer than
    /// `pages` pages (`LengthMismatch`), not enough host pages left (`OutOfPages`), a store of
    /// another shape.
    pub fn register_task<S: AdapterMemory + ?Sized>(
        &mut self,
        store: &mut S,
        task: TaskRef,
        pages: u32,
        weights: &[u8],
    ) -> Result<Range<u32>, MemError> {
        self.check_store(store)?;
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
        let page_bytes = self.shape.page_bytes;
        let capacity = (pages as usize).saturating_mul(page_bytes);
        if weights.len() > capacity {
            return Err(MemError::LengthMismatch {
                expected: capacity,
                actual: weights.len(),
            });
        }
        let free = self.shape.host_pages - self.host_used;
        if pages > free {
            return Err(MemError::OutOfPages {
                tier: Tier::Host,
                needed: pages,
                free,
            });
        }
        let first = self.host_used;
        self.scratch.resize(page_bytes, 0);
        for index in 0..pages {
            let start = (index as usize * page_bytes).min(weights.len());
            let end = (start + page_bytes).min(weights.len());
            let chunk = &weights[start..end];
            let data = if chunk.len() == page_bytes {
                chunk
            } else {
                self.scratch[..chunk.len()].copy_from_slice(chunk);
                self.scratch[chunk.len()..].fill(0);
                &self.scratch[..]
            };
            store.write_page(Tier::Host, first + index, data)?;
        }
        self.host_used += pages;
        if self.tasks.len() <= slot {
            self.tasks.resize_with(slot + 1, || None);
        }
        self.tasks[slot] = Some(Placement {
            task,
            host_first: first,
            pages,
            device: Vec::with_capacity(pages as usize),
        });
        Ok(first..first + pages)
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
    pub fn apply_plan<S: AdapterMemory + ?Sized, const T: usize, const N: usize>(
        &mut self,
        store: &mut S,
        pool: &AdapterPool<T>,
        evicted: &[TaskRef],
        out: &SchedulerOutput<N>,
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
                        src: placement.host_first + index,
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
    pub fn device_pages(&self, slot: u16) -> Option<&[u32]> {
        match self.tasks.get(usize::from(slot)) {
            Some(Some(placement)) if !placement.device.is_empty() => Some(&placement.device),
            _ => None,
        }
    }

    /// The host pages holding the weights of the adapter in task slot `slot`; `None` when not
    /// registered.
    pub fn host_pages(&self, slot: u16) -> Option<Range<u32>> {
        match self.tasks.get(usize::from(slot)) {
            Some(Some(placement)) => {
                Some(placement.host_first..placement.host_first + placement.pages)
            }
            _ => None,
        }
    }

    /// Device pages free for loads.
    pub fn device_free(&self) -> u32 {
        // Lossless: at most `gpu_pages` entries.
        self.device_free.len() as u32
    }

    /// Host pages not yet given to a registered adapter.
    pub fn host_free(&self) -> u32 {
        self.shape.host_pages - self.host_used
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
    use kvsched_core::request::TaskId;

    const PAGE: usize = 4;

    fn task(slot: u16) -> TaskRef {
        TaskRef {
            id: TaskId(100 + u64::from(slot)),
            slot,
        }
    }

    fn device(store: &HostAdapterStore, page: u32) -> Vec<u8> {
        let mut out = vec![0; PAGE];
        store.read_page(Tier::Gpu, page, &mut out).unwrap();
        out
    }

    fn setup() -> (HostAdapterStore, AdapterSlots) {
        let shape = PoolShape::new(PAGE, 4, 6);
        let mut store = HostAdapterStore::new(shape).unwrap();
        let mut slots = AdapterSlots::new(shape).unwrap();
        assert_eq!(slots.pages_for(5), 2);
        assert_eq!(
            slots
                .register_task(&mut store, task(0), 2, &[1, 1, 1, 1, 2])
                .unwrap(),
            0..2
        );
        assert_eq!(
            slots
                .register_task(&mut store, task(1), 3, &[3; 12])
                .unwrap(),
            2..5
        );
        (store, slots)
    }

    #[test]
    fn loads_upload_weights_and_evictions_reuse_pages() {
        let (mut store, mut slots) = setup();
        let up = slots.apply(&mut store, &[], &[task(0)]).unwrap();
        assert_eq!((up.loaded, up.pages), (1, 2));
        assert_eq!(slots.device_pages(0), Some(&[0, 1][..]));
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
        assert_eq!(slots.device_pages(0), None);
        assert_eq!(
            slots.device_pages(1),
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
            slot: 3,
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
            assert_eq!(slots.device_pages(0), Some(&[0, 1][..]));
            assert_eq!(slots.device_free(), 2);
        }
        // Evicted and loaded again in one plan: allowed.
        let up = slots.apply(&mut store, &[task(0)], &[task(0)]).unwrap();
        up.event.wait().unwrap();
        assert_eq!(slots.device_pages(0), Some(&[0, 1][..]));
    }

    #[test]
    fn registration_refusals() {
        let (mut store, mut slots) = setup();
        assert!(matches!(
            slots.register_task(&mut store, task(1), 1, &[]),
            Err(MemError::AdapterPlan { slot: 1, .. })
        ));
        assert_eq!(
            slots.register_task(&mut store, task(2), 1, &[0; 5]),
            Err(MemError::LengthMismatch {
                expected: 4,
                actual: 5
            })
        );
        assert_eq!(
            slots.register_task(&mut store, task(2), 2, &[]),
            Err(MemError::OutOfPages {
                tier: Tier::Host,
                needed: 2,
                free: 1
            })
        );
        assert_eq!(
            slots.register_task(&mut store, task(2), 1, &[]).unwrap(),
            5..6
        );
        assert_eq!(slots.host_free(), 0);
        assert_eq!(slots.host_pages(1), Some(2..5));
        let mut other = HostAdapterStore::new(PoolShape::new(PAGE, 4, 7)).unwrap();
        assert!(matches!(
            slots.apply(&mut other, &[], &[]),
            Err(MemError::InvalidShape { .. })
        ));
    }

    #[test]
    fn plan_from_the_core_adapter_cache() {
        use kvsched_core::adapter::{Holding, PeftBackend};
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
        pool.mark_request_done(RequestId(1), a, false, Holding::Lease);
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
        slots.register_task(&mut store, c, 1, &[]).unwrap();
        let free = slots.device_free();
        assert!(matches!(
            slots.apply_checked(&mut store, &pool, &[], &[c]),
            Err(MemError::AdapterPlan { slot: 2, .. })
        ));
        assert_eq!(slots.device_free(), free);
        assert_eq!(slots.device_pages(2), None);
    }
}
