//! Retiring an adapter, and the copies a reload or a retirement drops (beyond the reference: a server loads and unloads adapters while it runs): its
//! cached copies are dropped as a reload drops them, its id is no task's any more, and its slot goes
//! to the next registration, under a new weights version so no KV of the old adapter is reused.

use super::{AdapterPool, TaskEntry};
use crate::adapter::TaskRef;
use crate::error::PeftError;
use crate::ids::{TaskId, TaskSlot};
use crate::narrow::u16_of;

impl<const T: usize> AdapterPool<T> {
    /// Retires task `id`: its device copy is logged as evicted (for the binding) and its host copy as
    /// dropped; `lookup` no longer finds it. Refused, changing nothing, for an unknown task and while
    /// a request holds or is paused on it ([`PeftError::TaskBusy`]).
    pub fn retire(&mut self, id: TaskId) -> Result<TaskRef, PeftError> {
        let slot = self
            .tasks
            .iter()
            .position(|t| t.id == id && !t.retired)
            .ok_or(PeftError::UnknownTask(id))?;
        let t = self.tasks[slot];
        if t.active > 0 || t.paused > 0 {
            return Err(PeftError::TaskBusy(id));
        }
        let task = self.drop_copies(slot);
        self.tasks[slot].retired = true;
        Ok(task)
    }

    /// Drops task `slot`'s cached copies (a reload's, a retirement's): the device copy logged as
    /// evicted for the binding, the host copy as dropped. Returns the task.
    pub(super) fn drop_copies(&mut self, slot: usize) -> TaskRef {
        let t = self.tasks[slot];
        let task = TaskRef {
            id: t.id,
            slot: TaskSlot(u16_of(slot)),
        };
        if t.on_device {
            self.device_used -= t.pages;
            let logged = self.device_evicted.push(task);
            debug_assert!(logged.is_ok(), "one eviction per task before its next load");
        }
        if t.on_host {
            self.host_used -= t.pages;
            self.host_dropped(slot);
        }
        let e = &mut self.tasks[slot];
        e.on_device = false;
        e.on_host = false;
        task
    }

    /// Registers `id` (`pages` pages) in retired `slot`: a new version, nothing cached.
    pub(super) fn reuse(&mut self, slot: usize, id: TaskId, pages: u32) -> TaskRef {
        let old = self.tasks[slot];
        debug_assert!(old.retired && !old.on_device && !old.on_host);
        self.tasks[slot] = TaskEntry {
            id,
            pages,
            active: 0,
            paused: 0,
            on_device: false,
            on_host: false,
            last_use: 0,
            version: old.version + 1,
            retired: false,
        };
        TaskRef {
            id,
            slot: TaskSlot(u16_of(slot)),
        }
    }
}
