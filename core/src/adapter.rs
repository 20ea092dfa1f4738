//! The PEFT (LoRA adapter) backend contract: the trait the pass calls, the task references it hands
//! out, and the host-copy vocabulary the binding reads. The fixed-capacity adapter cache that implements
//! it is [`crate::adapter_pool::AdapterPool`].
//!
//! The cache has device pages and host pages. Per task it counts the requests that hold a lease
//! (`active`, the device refcount) and the requests paused on it (`paused`). Invariants (checked by
//! [`AdapterPool::check`](crate::adapter_pool::AdapterPool::check)):
//! - page conservation per tier: free + pages of resident tasks = capacity;
//! - a task with an active request is resident on the host; a task is evictable from the device only
//!   when `active == 0`, from the host only when `active == 0 && paused == 0`;
//! - eviction first checks that enough pages *can* be freed, then evicts (least recently used first),
//!   so a refused claim evicts nothing (upstream evicts everything and then fails).

use crate::error::PeftError;
use crate::ids::{RequestId, TaskId, TaskSlot};

/// A registered task: its id and its dense slot in the adapter cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskRef {
    /// The LoRA task id.
    pub id: TaskId,
    /// Dense slot in the adapter cache's task table.
    pub slot: TaskSlot,
}

/// What a request held when it lets go of a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterHold {
    /// A lease (device ownership): it was active on the task.
    Lease,
    /// A paused registration (host copy pinned for a later resume or replay).
    Paused,
}

/// The adapter-cache operations the scheduler uses (the reference PEFT manager, spec §3).
pub trait PeftBackend {
    /// Total device pages for adapters.
    fn max_device_pages(&self) -> u32;
    /// Resolves a task id (None: unknown task).
    fn lookup(&self, task: TaskId) -> Option<TaskRef>;
    /// Pages the task's adapter occupies (asked for request `req`).
    fn determine_num_pages(&mut self, req: RequestId, task: TaskRef) -> u32;
    /// Registers `req` as active on `task` (load to device = true). `from_pause`: the request was paused
    /// on the task and this is its resume. Refusal changes nothing.
    fn add_request(
        &mut self,
        req: RequestId,
        task: TaskRef,
        from_pause: bool,
    ) -> Result<(), PeftError>;
    /// Whether `add_request` for `task` would succeed now, without side effects. The pass asks before it
    /// finds KV pages (and perhaps preempts or evicts others) for a request that must acquire a lease,
    /// so a refusal it can foresee costs nothing. May be optimistic (the default says yes: backends that
    /// cannot tell are asked through `add_request` as before), never pessimistic.
    fn can_admit(&self, task: TaskRef) -> bool {
        let _ = task;
        true
    }
    /// Removes `req` from the task's `held` set; with `pause` it becomes paused on the task.
    fn mark_request_done(&mut self, req: RequestId, task: TaskRef, pause: bool, held: AdapterHold);
    /// Makes every task of the batch resident on the device, evicting done tasks; `load` is called for
    /// each task that had to be copied to the device. All-or-nothing.
    fn ensure_batch(
        &mut self,
        tasks: &[TaskRef],
        load: &mut dyn FnMut(TaskRef),
    ) -> Result<(), PeftError>;
    /// Side-effect free: the pages the task's adapter occupies, as registered (0 when unknown).
    fn pages_of(&self, task: TaskRef) -> u32 {
        let _ = task;
        0
    }
    /// The version of the task's weights: KV computed under one version is never reused under another
    /// (a reload under the same task id gives it a new version).
    fn cache_identity(&self, task: TaskRef) -> u64 {
        let _ = task;
        0
    }
    /// Hands `evicted` the tasks evicted from the device since the last call, in order (their device
    /// pages are free for reuse); the log is then empty. A backend without device memory logs nothing.
    fn take_device_evictions(&mut self, evicted: &mut dyn FnMut(TaskRef)) {
        let _ = evicted;
    }
    /// Hands `changed` every task whose host copy changed since the last call, with what the binding
    /// must do ([`HostChange`]), in the order the tasks first changed; the log is then empty. A backend
    /// without host memory logs nothing.
    fn take_host_changes(&mut self, changed: &mut dyn FnMut(TaskRef, HostChange)) {
        let _ = changed;
    }
}

/// What became of a task's host copy since the binding last looked (the adapter cache loads an
/// adapter into host pages when a request acquires its lease, and evicts host copies nobody holds
/// or is paused on when it needs room; [`AdapterPool::reload`](crate::adapter_pool::AdapterPool::reload) drops a copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostChange {
    /// The copy the binding holds is gone: free its host pages.
    Dropped,
    /// A new copy is needed: write the task's weights into host pages (it had none).
    Filled,
    /// The binding's copy is gone and a new one is needed (evicted and loaded again, or reloaded
    /// weights): free its pages, then write the weights anew.
    Replaced,
}

/// The configuration without an adapter cache: every LoRA request is scheduled with no PEFT work.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPeft;

impl PeftBackend for NoPeft {
    fn max_device_pages(&self) -> u32 {
        u32::MAX
    }
    fn lookup(&self, _task: TaskId) -> Option<TaskRef> {
        None
    }
    fn determine_num_pages(&mut self, _req: RequestId, _task: TaskRef) -> u32 {
        0
    }
    fn add_request(
        &mut self,
        _req: RequestId,
        _task: TaskRef,
        _from_pause: bool,
    ) -> Result<(), PeftError> {
        Ok(())
    }
    fn mark_request_done(
        &mut self,
        _req: RequestId,
        _task: TaskRef,
        _pause: bool,
        _held: AdapterHold,
    ) {
    }
    fn ensure_batch(
        &mut self,
        _tasks: &[TaskRef],
        _load: &mut dyn FnMut(TaskRef),
    ) -> Result<(), PeftError> {
        Ok(())
    }
}
