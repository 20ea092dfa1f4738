//! What a front end (the HTTP server) needs between steps: a request's tokens so far, cancelling a
//! request whose client went away, and where the engine's requests and pages stand.

use kvsched_core::kv::Tier;

use kvsched_core::TaskId;

use super::Engine;
use crate::error::{Refusal, Result};

/// Where the engine's requests and KV pages stand ([`Engine::load`]). On KV groups the page
/// counts are group 0's (full attention: the pages that grow with every request's context).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineLoad {
    /// Requests whose KV is on the GPU tier (they run when the pass schedules them).
    pub running: usize,
    /// Requests held but not on the GPU: waiting for their first chunk, suspended on the host tier,
    /// or waiting to replay their prefill.
    pub waiting: usize,
    /// GPU-tier KV pages in all.
    pub gpu_pages: u32,
    /// Of those, pages a request holds (neither free nor an idle prefix-cache block).
    pub gpu_used: u32,
    /// Host-tier KV pages in all.
    pub host_pages: u32,
    /// Of those, pages a request holds.
    pub host_used: u32,
    /// Idle prefix-cache blocks on the GPU tier (reusable by a later prompt, reclaimable).
    pub gpu_cached: u32,
}

impl Engine<'_> {
    /// Retires adapter `id` (registered with [`Engine::register_adapter`]): its copies dropped now,
    /// its pages free, its slot ready for the next registration (under a new weights version, so no
    /// KV of it is reused). Refused, changing nothing, while a request the engine holds uses it, or
    /// for an unknown id.
    pub fn unregister_adapter(&mut self, id: u64) -> Result<()> {
        if !self.tasks.contains_key(&id) {
            return Err(Refusal::UnknownAdapter(id).into());
        }
        let task = self.sched.retire_adapter(TaskId(id))?;
        self.apply_host_changes()?;
        self.evicted.clear();
        let evicted = &mut self.evicted;
        self.sched.take_adapter_evictions(|t| evicted.push(t));
        let freed = self.slots.apply(&mut self.adapters, &self.evicted, &[])?;
        freed.event.wait()?;
        self.stats.adapter_evictions += u64::from(freed.evicted);
        self.slots.unregister_task(task)?;
        if let Some(w) = self.weights.get_mut(usize::from(task.slot)) {
            *w = Vec::new();
        }
        self.tasks.remove(&id);
        Ok(())
    }

    /// Drops every idle block of the prefix cache (vLLM's `reset_prefix_cache`): the pages free,
    /// each drop a KV event; blocks a live request holds stay. Returns the blocks dropped.
    pub fn reset_prefix_cache(&mut self) -> u32 {
        self.sched.reset_prefix_cache()
    }

    /// The tokens request `id` has generated so far (a stop token included); `None` once it
    /// finished, or for an unknown id.
    pub fn tokens(&self, id: u64) -> Option<&[u32]> {
        let live = self.live.iter().flatten().find(|l| l.id == id)?;
        Some(&live.tokens[live.prompt..])
    }

    /// Cancels request `id` between steps (its client went away): the scheduler removes it, so its
    /// KV pages are freed and its adapter lease returned. `Ok(false)` for an unknown or finished id.
    /// Refused (`Scheduler`) for a context-only request whose KV send has not ended.
    pub fn cancel(&mut self, id: u64) -> Result<bool> {
        if self.cancel_search(id)? {
            return Ok(true);
        }
        let Some(slot) = self
            .live
            .iter()
            .position(|l| l.as_ref().is_some_and(|l| l.id == id))
        else {
            return Ok(self.cancel_waiting(id));
        };
        // Its samples still waiting run alone (another sample's client may still want them).
        self.detach_samples_of(slot);
        let handle = self.live[slot].as_ref().map(|l| l.handle);
        if let Some(handle) = handle {
            self.sched.remove(handle)?;
            self.live[slot] = None;
            self.stats.cancelled += 1;
        }
        Ok(true)
    }

    /// Where the requests and the KV pages stand now.
    pub fn load(&self) -> EngineLoad {
        let kv = self.sched.leader();
        let cfg = kv.config();
        let mut load = EngineLoad {
            gpu_pages: cfg.gpu_pages,
            host_pages: cfg.host_pages,
            gpu_cached: kv.idle_pages(Tier::Gpu),
            ..EngineLoad::default()
        };
        load.gpu_used = cfg
            .gpu_pages
            .saturating_sub(kv.gpu_free() + load.gpu_cached);
        load.host_used = cfg
            .host_pages
            .saturating_sub(kv.host_free() + kv.idle_pages(Tier::Host));
        for live in self.live.iter().flatten() {
            let on_gpu = self
                .sched
                .get(live.handle)
                .is_ok_and(|e| e.ownership().on_gpu());
            if on_gpu {
                load.running += 1;
            } else {
                load.waiting += 1;
            }
        }
        load
    }
}
