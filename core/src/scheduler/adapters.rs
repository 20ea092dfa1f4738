//! The scheduler's public API for adapters: registering, reloading and retiring one in the built-in
//! adapter cache, and the evictions and host-copy changes a device binding applies.

use crate::adapter::{PeftBackend, TaskRef};
use crate::error::PeftError;
use crate::kv::{AdapterPaging, KvBackend, KvCaps};
use crate::storage::Storage;

use super::Scheduler;

impl<K: KvBackend, const N: usize, const T: usize, S: Storage>
    Scheduler<K, crate::AdapterPool<T>, N, T, S>
{
    /// Registers an adapter with the adapter cache (see [`crate::AdapterPool::register`]).
    pub fn register_adapter(
        &mut self,
        id: crate::ids::TaskId,
        pages: u32,
    ) -> Result<TaskRef, PeftError> {
        self.changed();
        self.desk.backend_mut().register(id, pages)
    }

    /// Replaces an adapter's weights under the same task id (see [`crate::AdapterPool::reload`]): requests
    /// submitted from now on get a new prefix identity, so the KV cached under the old weights is never
    /// reused. Refused ([`PeftError::TaskBusy`], nothing changes) while any live request uses the task —
    /// waiting ones included, whose prefix identity names the old weights.
    pub fn reload_adapter(
        &mut self,
        id: crate::ids::TaskId,
        pages: u32,
    ) -> Result<TaskRef, PeftError> {
        self.changed();
        let in_use = (0..self.table.len())
            .any(|i| self.table.entry(self.table.slot(i)).spec().lora == Some(id));
        if in_use {
            return Err(PeftError::TaskBusy(id));
        }
        let task = self.desk.backend_mut().reload(id, pages)?;
        // Unified paging: the old weights' device copy leaves the KV pool.
        if let Some(a) = self.kv.adapters() {
            a.drop_adapter(task.slot);
        }
        Ok(task)
    }

    /// Retires an adapter (see [`crate::AdapterPool::retire`]): its copies dropped, its slot free for
    /// the next registration. Refused ([`PeftError::TaskBusy`], nothing changes) while any live request
    /// uses the task, waiting ones included.
    pub fn retire_adapter(&mut self, id: crate::ids::TaskId) -> Result<TaskRef, PeftError> {
        self.changed();
        let in_use = (0..self.table.len())
            .any(|i| self.table.entry(self.table.slot(i)).spec().lora == Some(id));
        if in_use {
            return Err(PeftError::TaskBusy(id));
        }
        let task = self.desk.backend_mut().retire(id)?;
        if let Some(a) = self.kv.adapters() {
            a.drop_adapter(task.slot);
        }
        Ok(task)
    }
}

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Scheduler<K, P, N, T, S>
{
    /// Adapters evicted from the device since the last call (their device pages are free for reuse), in
    /// order: with the loads `ensure_batch` reports, the adapter plan a device binding applies.
    ///
    /// With unified paging they come from the KV pool: an evicted adapter's pages hold KV now.
    pub fn take_adapter_evictions(&mut self, mut evicted: impl FnMut(TaskRef)) {
        self.desk.backend_mut().take_device_evictions(&mut evicted);
        let desk = &self.desk;
        if let Some(a) = self.kv.adapters() {
            a.take_adapter_evictions(&mut |slot| {
                if usize::from(slot) < T {
                    evicted(desk.task_ref(slot));
                }
            });
        }
    }

    /// Adapters whose host copy changed since the last call (loaded into host pages when a request
    /// acquired its lease, evicted from them for room, or dropped by a reload), each once with what
    /// the binding must do: free its host pages, write its weights, or both. Take them after the pass
    /// and before the adapter plan's device loads, which read the host copies.
    pub fn take_adapter_host_changes(
        &mut self,
        mut changed: impl FnMut(TaskRef, crate::adapter::HostChange),
    ) {
        self.desk.backend_mut().take_host_changes(&mut changed);
    }
}
