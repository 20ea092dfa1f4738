//! The fixed-capacity adapter cache: the built-in [`PeftBackend`], with device pages and host pages
//! (invariants in [`crate::adapter`]). Its tests are in `adapter_pool/tests.rs`.

use crate::adapter::{AdapterHold, HostChange, PeftBackend, TaskRef};
use crate::error::PeftError;
use crate::ids::{RequestId, TaskId, TaskSlot};
use crate::narrow::u16_of;

/// Pending host-copy change bits of one task slot.
const HOST_DROPPED: u8 = 1;
const HOST_FILLED: u8 = 2;
/// The slot is in the change log already.
const HOST_LISTED: u8 = 4;

/// One task's entry in the adapter cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskEntry {
    /// Task id.
    pub id: TaskId,
    /// Pages the adapter occupies (on either tier).
    pub pages: u32,
    /// Requests holding a lease (device refcount).
    pub active: u32,
    /// Requests paused on the task.
    pub paused: u32,
    /// Resident on the device.
    pub on_device: bool,
    /// Resident on the host.
    pub on_host: bool,
    /// Last use, for least-recently-used eviction.
    pub last_use: u64,
    /// The version of its weights (bumped by [`AdapterPool::reload`]): the prefix cache keys KV by it.
    pub version: u64,
    /// Retired ([`AdapterPool::retire`]): no task by its id, the slot free for the next registration.
    pub retired: bool,
}

/// Counters of adapter-cache activity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdapterStats {
    /// Host → device copies.
    pub device_loads: u64,
    /// Device evictions.
    pub device_evictions: u64,
    /// Host loads (weights stored into host pages).
    pub host_loads: u64,
    /// Host evictions.
    pub host_evictions: u64,
}

/// A fixed-capacity adapter cache with `T` task slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterPool<const T: usize> {
    tasks: heapless::Vec<TaskEntry, T>,
    device_pages: u32,
    host_pages: u32,
    device_used: u32,
    host_used: u32,
    clock: u64,
    stats: AdapterStats,
    device_evicted: heapless::Vec<TaskRef, T>,
    /// Slots whose host copy changed since the last `take_host_changes`, in order, each once.
    host_changed: heapless::Vec<TaskSlot, T>,
    /// Their pending `HOST_*` bits, by slot.
    host_bits: [u8; T],
    /// Unified paging: the device copies live in the KV pool, which places and evicts them
    /// ([`crate::kv::AdapterPaging::pin_adapter`]); this cache keeps the host tier only.
    unified: bool,
}

impl<const T: usize> AdapterPool<T> {
    /// A cache with `device_pages` device pages and `host_pages` host pages.
    pub fn new(device_pages: u32, host_pages: u32) -> Result<Self, crate::Error> {
        if device_pages == 0 || host_pages == 0 {
            return Err(crate::Error::Invalid(
                "adapter cache needs at least one device page and one host page",
            ));
        }
        Ok(Self {
            tasks: heapless::Vec::new(),
            device_pages,
            host_pages,
            device_used: 0,
            host_used: 0,
            clock: 0,
            stats: AdapterStats::default(),
            device_evicted: heapless::Vec::new(),
            host_changed: heapless::Vec::new(),
            host_bits: [0; T],
            unified: false,
        })
    }

    /// A cache for unified paging (beyond the reference): `host_pages` host pages, and the device
    /// copies placed in the KV pool's GPU pages (a pool with [`crate::KvPool::page_adapters`]), whose
    /// `device_space` pages bound an adapter's size. Its device tier stays empty: `ensure_batch` finds
    /// every leased adapter resident already (a lease pins it in the pool).
    pub fn unified(device_space: u32, host_pages: u32) -> Result<Self, crate::Error> {
        let mut p = Self::new(device_space, host_pages)?;
        p.unified = true;
        Ok(p)
    }

    /// The device copies live in the KV pool ([`AdapterPool::unified`]).
    pub fn is_unified(&self) -> bool {
        self.unified
    }

    /// Registers a task whose adapter occupies `pages` pages, in a retired task's slot when there is
    /// one ([`AdapterPool::retire`]).
    pub fn register(&mut self, id: TaskId, pages: u32) -> Result<TaskRef, PeftError> {
        if self.tasks.iter().any(|t| t.id == id && !t.retired) {
            return Err(PeftError::DuplicateTask(id));
        }
        let capacity = self.device_pages.min(self.host_pages);
        if pages == 0 || pages > capacity {
            return Err(PeftError::AdapterTooLarge {
                task: id,
                pages,
                capacity,
            });
        }
        if let Some(slot) = self.tasks.iter().position(|t| t.retired) {
            return Ok(self.reuse(slot, id, pages));
        }
        let slot = TaskSlot(u16_of(self.tasks.len()));
        self.tasks
            .push(TaskEntry {
                id,
                pages,
                active: 0,
                paused: 0,
                on_device: false,
                on_host: false,
                last_use: 0,
                version: 0,
                retired: false,
            })
            .map_err(|_| PeftError::TaskTableFull)?;
        Ok(TaskRef { id, slot })
    }

    /// Replaces a registered task's weights (a new adapter under the same task id, `pages` pages): its
    /// cached copies are dropped (a device copy is logged as evicted, for the binding) and its version is
    /// bumped, so KV computed under the old weights is never reused under the new ones. Refused, changing
    /// nothing, while a request holds or is paused on the task, or for an adapter larger than the cache.
    pub fn reload(&mut self, id: TaskId, pages: u32) -> Result<TaskRef, PeftError> {
        let slot = self
            .tasks
            .iter()
            .position(|t| t.id == id && !t.retired)
            .ok_or(PeftError::UnknownTask(id))?;
        let capacity = self.device_pages.min(self.host_pages);
        if pages == 0 || pages > capacity {
            return Err(PeftError::AdapterTooLarge {
                task: id,
                pages,
                capacity,
            });
        }
        let t = self.tasks[slot];
        if t.active > 0 || t.paused > 0 {
            return Err(PeftError::TaskBusy(id));
        }
        let task = self.drop_copies(slot);
        let e = &mut self.tasks[slot];
        e.pages = pages;
        e.version += 1;
        Ok(task)
    }

    /// The task entries.
    pub fn tasks(&self) -> &[TaskEntry] {
        &self.tasks
    }

    /// Device pages in use.
    pub fn device_used(&self) -> u32 {
        self.device_used
    }

    /// Host pages in use.
    pub fn host_used(&self) -> u32 {
        self.host_used
    }

    /// Total host pages.
    pub fn host_pages(&self) -> u32 {
        self.host_pages
    }

    /// Activity counters.
    pub fn stats(&self) -> AdapterStats {
        self.stats
    }

    /// Page conservation and residency invariants (see the module docs).
    pub fn check(&self) -> bool {
        let dev: u32 = self
            .tasks
            .iter()
            .filter(|t| t.on_device)
            .map(|t| t.pages)
            .sum();
        let host: u32 = self
            .tasks
            .iter()
            .filter(|t| t.on_host)
            .map(|t| t.pages)
            .sum();
        dev == self.device_used
            && host == self.host_used
            && dev <= self.device_pages
            && host <= self.host_pages
            && self.tasks.iter().all(|t| t.active == 0 || t.on_host)
    }

    /// Logs that `slot`'s host copy is gone. A copy loaded since the binding last looked was never
    /// written, so it is forgotten; an older one must be freed.
    fn host_dropped(&mut self, slot: usize) {
        let bits = &mut self.host_bits[slot];
        if *bits & HOST_FILLED != 0 {
            *bits &= !HOST_FILLED;
        } else {
            *bits |= HOST_DROPPED;
        }
        self.note_host_change(slot);
    }

    /// Logs that `slot` was loaded into host pages: the binding must write its weights.
    fn host_filled(&mut self, slot: usize) {
        self.host_bits[slot] |= HOST_FILLED;
        self.note_host_change(slot);
    }

    fn note_host_change(&mut self, slot: usize) {
        if self.host_bits[slot] & HOST_LISTED == 0 {
            self.host_bits[slot] |= HOST_LISTED;
            // At most one entry per task slot: the log has room for all.
            let logged = self.host_changed.push(TaskSlot(u16_of(slot)));
            debug_assert!(logged.is_ok(), "one entry per task slot");
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Frees `need` pages on one tier by evicting least-recently-used evictable tasks, after checking that
    /// enough can be freed. `skip` marks tasks that must stay (the batch).
    fn claim(&mut self, device: bool, need: u32, skip: &dyn Fn(usize) -> bool) -> bool {
        let (cap, used) = if device {
            (self.device_pages, self.device_used)
        } else {
            (self.host_pages, self.host_used)
        };
        let free = cap - used;
        if need <= free {
            return true;
        }
        let evictable = |t: &TaskEntry| {
            if device {
                t.on_device && t.active == 0
            } else {
                t.on_host && t.active == 0 && t.paused == 0
            }
        };
        let obtainable: u32 = self
            .tasks
            .iter()
            .enumerate()
            .filter(|(i, t)| evictable(t) && !skip(*i))
            .map(|(_, t)| t.pages)
            .sum();
        if free + obtainable < need {
            return false;
        }
        let mut freed = free;
        while freed < need {
            // Least recently used evictable task. The sufficiency check above guarantees one exists.
            let Some(victim) = self
                .tasks
                .iter()
                .enumerate()
                .filter(|(i, t)| evictable(t) && !skip(*i))
                .min_by_key(|(_, t)| t.last_use)
                .map(|(i, _)| i)
            else {
                return false;
            };
            let t = &mut self.tasks[victim];
            if device {
                t.on_device = false;
                self.device_used -= t.pages;
                self.stats.device_evictions += 1;
                // A task is evicted at most once before it is loaded again: the log has room for all.
                let _ = self.device_evicted.push(TaskRef {
                    id: t.id,
                    slot: TaskSlot(u16_of(victim)),
                });
            } else {
                t.on_host = false;
                let pages = t.pages;
                self.host_used -= pages;
                self.stats.host_evictions += 1;
                self.host_dropped(victim);
            }
            freed += self.tasks[victim].pages;
        }
        true
    }

    /// [`PeftBackend::ensure_batch`] of a unified pool: every batch adapter is pinned in the KV pool by
    /// its leases, so there is nothing to claim; the batch's tasks are only marked used.
    #[inline]
    fn touch_unified(&mut self, tasks: &[TaskRef]) -> Result<(), PeftError> {
        if let Some(tr) = tasks
            .iter()
            .find(|t| usize::from(t.slot) >= self.tasks.len())
        {
            return Err(PeftError::UnknownTask(tr.id));
        }
        let now = self.tick();
        for tr in tasks {
            self.tasks[usize::from(tr.slot)].last_use = now;
        }
        Ok(())
    }

    /// The device pages the batch's non-resident tasks need (a task listed twice counts once).
    #[inline]
    fn pages_to_load(&self, tasks: &[TaskRef]) -> Result<u32, PeftError> {
        let mut need = 0u32;
        for tr in tasks {
            let t = self
                .tasks
                .get(tr.slot.index())
                .ok_or(PeftError::UnknownTask(tr.id))?;
            if !t.on_device
                && !tasks
                    .iter()
                    .take_while(|x| *x != tr)
                    .any(|x| x.slot == tr.slot)
            {
                need += t.pages;
            }
        }
        Ok(need)
    }

    /// The refusal of a batch whose `need` pages cannot be obtained: what could be, and for which task.
    #[inline]
    fn cache_full(&self, tasks: &[TaskRef], need: u32) -> PeftError {
        let free = self.device_pages - self.device_used;
        let obtainable = free
            + self
                .tasks
                .iter()
                .enumerate()
                .filter(|(j, t)| t.on_device && t.active == 0 && !in_batch(*j, tasks))
                .map(|(_, t)| t.pages)
                .sum::<u32>();
        let first = tasks
            .iter()
            .find(|tr| !self.tasks[tr.slot.index()].on_device)
            .copied();
        let task = first.map_or(TaskId(0), |t| t.id);
        PeftError::DeviceCacheFull {
            task,
            needed: need,
            obtainable,
        }
    }

    /// Loads the batch's non-resident tasks (their pages claimed) and marks every batch task used.
    #[inline]
    fn load_batch(&mut self, tasks: &[TaskRef], load: &mut dyn FnMut(TaskRef)) {
        let now = self.tick();
        for tr in tasks {
            let t = &mut self.tasks[tr.slot.index()];
            if !t.on_device {
                t.on_device = true;
                self.device_used += t.pages;
                self.stats.device_loads += 1;
                load(*tr);
            }
            t.last_use = now;
        }
    }
}

/// Whether slot `j` holds one of the batch's tasks.
#[inline]
fn in_batch(j: usize, tasks: &[TaskRef]) -> bool {
    tasks.iter().any(|t| t.slot.index() == j)
}

impl<const T: usize> PeftBackend for AdapterPool<T> {
    fn max_device_pages(&self) -> u32 {
        self.device_pages
    }

    fn lookup(&self, task: TaskId) -> Option<TaskRef> {
        self.tasks
            .iter()
            .position(|t| t.id == task && !t.retired)
            .map(|i| TaskRef {
                id: task,
                slot: TaskSlot(u16_of(i)),
            })
    }

    fn determine_num_pages(&mut self, _req: RequestId, task: TaskRef) -> u32 {
        self.tasks.get(task.slot.index()).map_or(0, |t| t.pages)
    }

    fn cache_identity(&self, task: TaskRef) -> u64 {
        self.tasks.get(task.slot.index()).map_or(0, |t| t.version)
    }

    fn pages_of(&self, task: TaskRef) -> u32 {
        self.tasks.get(task.slot.index()).map_or(0, |t| t.pages)
    }

    fn can_admit(&self, task: TaskRef) -> bool {
        let i = task.slot.index();
        let Some(t) = self.tasks.get(i) else {
            return false;
        };
        if t.on_host {
            return true;
        }
        // The same sufficiency test `claim` makes for the host tier.
        let obtainable: u32 = self
            .tasks
            .iter()
            .enumerate()
            .filter(|&(j, o)| j != i && o.on_host && o.active == 0 && o.paused == 0)
            .map(|(_, o)| o.pages)
            .sum();
        (self.host_pages - self.host_used) + obtainable >= t.pages
    }

    fn add_request(
        &mut self,
        _req: RequestId,
        task: TaskRef,
        from_pause: bool,
    ) -> Result<(), PeftError> {
        let i = task.slot.index();
        let Some(t) = self.tasks.get(i) else {
            return Err(PeftError::UnknownTask(task.id));
        };
        if !t.on_host {
            let pages = t.pages;
            if !self.claim(false, pages, &|j| j == i) {
                return Err(PeftError::HostCacheFull(task.id));
            }
            let t = &mut self.tasks[i];
            t.on_host = true;
            self.host_used += pages;
            self.stats.host_loads += 1;
            self.host_filled(i);
        }
        let now = self.tick();
        let t = &mut self.tasks[i];
        t.active += 1;
        if from_pause {
            debug_assert!(
                t.paused > 0,
                "resume from a pause that was never registered"
            );
            t.paused = t.paused.saturating_sub(1);
        }
        t.last_use = now;
        Ok(())
    }

    fn mark_request_done(
        &mut self,
        _req: RequestId,
        task: TaskRef,
        pause: bool,
        held: AdapterHold,
    ) {
        let now = self.tick();
        let Some(t) = self.tasks.get_mut(task.slot.index()) else {
            return;
        };
        match held {
            AdapterHold::Lease => {
                debug_assert!(t.active > 0);
                t.active = t.active.saturating_sub(1);
            }
            AdapterHold::Paused => {
                debug_assert!(t.paused > 0);
                t.paused = t.paused.saturating_sub(1);
            }
        }
        if pause {
            t.paused += 1;
        }
        t.last_use = now;
    }

    fn ensure_batch(
        &mut self,
        tasks: &[TaskRef],
        load: &mut dyn FnMut(TaskRef),
    ) -> Result<(), PeftError> {
        // All-or-nothing: the pages of every non-resident batch task must be obtainable without evicting
        // a batch task.
        if self.unified {
            return self.touch_unified(tasks);
        }
        let need = self.pages_to_load(tasks)?;
        if need > 0 && !self.claim(true, need, &|j| in_batch(j, tasks)) {
            return Err(self.cache_full(tasks, need));
        }
        self.load_batch(tasks, load);
        Ok(())
    }

    /// The log holds `T` entries (a task is evicted at most once before it is loaded again): drain it
    /// after every `ensure_batch` when a device binding follows the plan.
    fn take_device_evictions(&mut self, evicted: &mut dyn FnMut(TaskRef)) {
        for t in &self.device_evicted {
            evicted(*t);
        }
        self.device_evicted.clear();
    }

    fn take_host_changes(&mut self, changed: &mut dyn FnMut(TaskRef, HostChange)) {
        for &slot in &self.host_changed {
            let i = usize::from(slot);
            let change = match self.host_bits[i] & !HOST_LISTED {
                HOST_DROPPED => Some(HostChange::Dropped),
                HOST_FILLED => Some(HostChange::Filled),
                b if b == HOST_DROPPED | HOST_FILLED => Some(HostChange::Replaced),
                _ => None, // loaded and evicted again before anyone looked: nothing to do
            };
            self.host_bits[i] = 0;
            if let Some(change) = change {
                changed(
                    TaskRef {
                        id: self.tasks[i].id,
                        slot,
                    },
                    change,
                );
            }
        }
        self.host_changed.clear();
    }
}

mod retire;
#[cfg(test)]
mod tests;
