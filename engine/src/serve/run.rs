//! One step of the serving loop (see the parent module's list), and the poisoning of free pages.

use super::{
    backend, entry_of, weight_error, Completion, Dirty, Engine, Finish, Live, Row, MAX_REQUESTS,
};
use crate::error::{EngineError, Result};
use crate::step::{Batch, GroupedKv, Logits, Sequence};
use kvsched_core::adapter::TaskRef;
use kvsched_core::ids::TaskSlot;
use kvsched_core::kv::Tier;
use kvsched_core::page_pool::NO_PAGE;
use kvsched_gpu::{AdapterSlots, PageStore};
use std::collections::HashMap;
use std::time::Instant;

/// Consecutive steps without a model step after which [`Engine::run`] gives up (and a serving loop
/// of its own should too: a request the pass never schedules must not hang).
pub const STALL_STEPS: u32 = 2000;

impl Engine<'_> {
    /// Runs one iteration: the pass, the page moves and adapter plan, the model step over the
    /// scheduled batch, sampling. Returns the requests that finished in it (removed from the
    /// engine).
    pub fn step(&mut self) -> Result<Vec<Completion>> {
        let started = Instant::now();
        self.propose_drafts()?;
        let scheduling = Instant::now();
        self.sched.schedule(&mut self.out)?;
        self.sched.ensure_batch(&mut self.out)?;
        self.stats.scheduler_ns += nanos(scheduling);
        self.stats.steps += 1;
        let pass = self.sched.last_pass();
        self.stats.preemptions += u64::from(pass.preemptions);
        self.stats.evictions += u64::from(pass.victims + pass.self_evictions);
        self.stats.recomputes += self.out.recompute_paused().len() as u64;
        self.apply_moves()?;
        self.apply_adapters()?;
        self.receive_transfers()?;
        self.stage_tables()?;
        let preparing = Instant::now();
        self.prepare_batch()?;
        self.stats.prep_ns += nanos(preparing);
        // The rows out of the batch while the step reads them (an empty `Vec` holds no memory).
        let rows = std::mem::take(&mut self.batch.rows);
        let done = self.run_rows(&rows);
        self.batch.rows = rows;
        let done = done?;
        self.replay_recomputed()?;
        self.fork_samples()?;
        self.select_beams()?;
        if self.cfg.poison {
            self.poison()?;
        }
        self.stats.step_ns += nanos(started);
        Ok(done)
    }

    /// The model step over `rows` (when there are any), `complete_step`, sampling.
    fn run_rows(&mut self, rows: &[Row]) -> Result<Vec<Completion>> {
        let logits = if rows.is_empty() {
            None
        } else {
            Some(self.run_batch(rows)?)
        };
        let completing = Instant::now();
        self.sched.complete_step(&self.out)?;
        self.stats.scheduler_ns += nanos(completing);
        self.book_kv_events();
        self.advance(rows, logits.as_ref())
    }

    /// Steps until every request finished; returns their completions in id order. Fails with the
    /// scheduler's deadlock error, or [`EngineError::Stalled`] after many steps without work.
    pub fn run(&mut self) -> Result<Vec<Completion>> {
        self.run_with(|_| Ok(()))
    }

    /// [`Engine::run`], calling `refill` before every step (and stopping once the engine is empty
    /// after it): a caller with more requests than the engine holds submits them as slots free up.
    /// An error of `refill` ends the run with it.
    pub fn run_with(
        &mut self,
        mut refill: impl FnMut(&mut Self) -> Result<()>,
    ) -> Result<Vec<Completion>> {
        let mut all = Vec::new();
        let mut idle = 0;
        loop {
            refill(self)?;
            if self.is_empty() {
                break;
            }
            let before = self.stats.model_steps;
            all.extend(self.step()?);
            idle = if self.stats.model_steps == before {
                idle + 1
            } else {
                0
            };
            if idle == STALL_STEPS {
                return Err(EngineError::Stalled { steps: idle });
            }
        }
        all.sort_by_key(|c| c.id);
        Ok(all)
    }

    /// Each KV group's move log into its host store, then its block tables.
    fn apply_moves(&mut self) -> Result<()> {
        self.stats.scheduler_ns += backend::apply_moves(&mut self.sched, &mut self.kv)?;
        Ok(())
    }

    fn stage_tables(&mut self) -> Result<()> {
        backend::stage_tables(&self.sched, &self.out, &mut self.kv)
    }

    /// The adapters' host copies, then the adapter plan (evictions, uploads to device pages).
    fn apply_adapters(&mut self) -> Result<()> {
        self.apply_host_changes()?;
        self.evicted.clear();
        let evicted = &mut self.evicted;
        self.sched.take_adapter_evictions(|task| evicted.push(task));
        let uploads = self.slots.apply_plan(
            &mut self.adapters,
            self.sched.adapters(),
            &self.evicted,
            &self.out,
        )?;
        uploads.event.wait()?;
        self.stats.adapter_loads += u64::from(uploads.loaded);
        self.stats.adapter_evictions += u64::from(uploads.evicted);
        Ok(())
    }

    /// The adapters' host copies as the core changed them: dropped copies' pages freed, filled ones
    /// written from the registered weights.
    pub(super) fn apply_host_changes(&mut self) -> Result<()> {
        self.host_changes.clear();
        let changes = &mut self.host_changes;
        self.sched
            .take_adapter_host_changes(|task, change| changes.push((task, change)));
        let weights = &self.weights;
        self.slots.apply_host_changes(
            &mut self.adapters,
            &self.host_changes,
            &mut |task, buf| {
                let w = weights
                    .get(usize::from(task.slot))
                    .filter(|w| !w.is_empty() && w.len() <= buf.len())
                    .ok_or_else(|| weight_error(task.slot))?;
                buf[..w.len()].copy_from_slice(w);
                Ok(())
            },
        )?;
        Ok(())
    }

    /// The model step over the rows.
    fn run_batch(&mut self, rows: &[Row]) -> Result<Logits> {
        self.mark_dirty();
        let (tables, locals) = (&self.batch.tables, &self.batch.locals);
        let mut inputs = Vec::with_capacity(rows.len());
        for r in rows {
            let live = self.live[usize::from(r.slot)]
                .as_ref()
                .ok_or_else(|| EngineError::Batch(format!("slot {} is empty", r.slot)))?;
            // A context chunk's tokens; a generation step's last token, then its drafts.
            let mut input = live.tokens[r.start..(r.start + r.len).min(live.tokens.len())].to_vec();
            input.extend_from_slice(if r.context { &[] } else { &live.draft });
            inputs.push(input);
        }
        let mut batch = Batch::new();
        for (i, ((r, pages), input)) in rows.iter().zip(tables).zip(&inputs).enumerate() {
            let live = self.live[usize::from(r.slot)]
                .as_ref()
                .ok_or_else(|| EngineError::Batch(format!("slot {} is empty", r.slot)))?;
            batch.push(Sequence {
                tokens: input,
                start: r.start,
                pages,
                local_pages: locals.get(i).map(Vec::as_slice),
                logits: r.logits,
                adapter: adapter_pages(&self.tasks, &self.slots, live, r)?,
            });
        }
        let adapters: &dyn PageStore = &self.adapters;
        let last: Vec<usize> = rows
            .iter()
            .map(|r| {
                if r.context {
                    usize::from(r.logits)
                } else {
                    r.len
                }
            })
            .collect();
        let stepping = Instant::now();
        let logits = match self.kv.as_mut_slice() {
            [one] => self
                .model
                .step_with_logits(&batch, &mut one.kv, Some(adapters), &last)?,
            [global, local] => {
                let kv = GroupedKv {
                    global: &mut global.kv,
                    local: &mut local.kv,
                };
                self.model.step_grouped(&batch, kv, Some(adapters), &last)?
            }
            _ => return Err(EngineError::Batch("no KV store".into())),
        };
        self.stats.model_ns += nanos(stepping);
        self.stats.model_steps += 1;
        self.stats.largest_batch = self.stats.largest_batch.max(rows.len() as u64);
        Ok(logits)
    }

    /// After the step: positions computed, tokens sampled, finished requests removed.
    fn advance(&mut self, rows: &[Row], logits: Option<&Logits>) -> Result<Vec<Completion>> {
        let mut done = Vec::new();
        for (i, r) in rows.iter().enumerate() {
            let Some(live) = self.live[usize::from(r.slot)].as_mut() else {
                continue;
            };
            if r.context {
                if live.computed == 0 && self.cfg.prefix_cache {
                    if live.extras.cached == 0 {
                        live.extras.cached = r.start;
                    }
                    self.stats.prefix_reused_tokens += r.start as u64;
                    self.stats.prefix_queried_tokens += live.tokens.len() as u64;
                }
                self.stats.prefill_tokens += r.len as u64;
                self.stats.context_chunks += 1;
            }
            let beam = live.extras.beam.is_some();
            let Some(logits) = logits.filter(|l| l.count(i) > 0) else {
                live.computed = r.start + r.len;
                continue;
            };
            if beam {
                self.beam_step(i, r, logits)?;
                continue;
            }
            // A context-only request stays, sending its KV, until its send ends.
            if let Some(how) = self.take_tokens(i, r, logits)? {
                if !self.live[usize::from(r.slot)]
                    .as_ref()
                    .is_some_and(|l| l.context_only)
                {
                    done.push(self.finish(r.slot, how)?);
                }
            }
        }
        Ok(done)
    }

    fn finish(&mut self, slot: u16, finish: Finish) -> Result<Completion> {
        // Its samples waiting for its prompt are forked before it leaves (or wait for room alone).
        self.fork_samples_of(usize::from(slot))?;
        self.detach_samples_of(usize::from(slot));
        let mut live = self.live[usize::from(slot)]
            .take()
            .ok_or_else(|| EngineError::Batch(format!("slot {slot} is empty")))?;
        self.sched.remove(live.handle)?;
        self.stats.finished += 1;
        let tokens = live.tokens.split_off(live.prompt);
        Ok(Completion {
            id: live.id,
            prompt: live.tokens,
            tokens,
            finish,
            logits: live.logits,
            logprobs: live.extras.logprobs,
            cached_tokens: live.extras.cached,
        })
    }

    /// A recompute-paused or preempted request lost its KV: it replays its prefill over its prompt
    /// and the tokens it generated, and may generate what is left.
    fn replay_recomputed(&mut self) -> Result<()> {
        for &l in self.out.recompute_paused() {
            let Some(live) = self.live[usize::from(l.slot())]
                .as_mut()
                .filter(|r| r.handle == l.handle())
            else {
                continue;
            };
            live.computed = 0;
            live.draft.clear();
            let prompt = live.tokens.len() as u32;
            let remaining = (live.max_new - live.generated()) as u32;
            self.sched.update(live.handle, |s| {
                s.prompt = prompt;
                s.max_new_tokens = remaining;
                s.draft = 0;
            })?;
        }
        Ok(())
    }

    /// Fills every free page that may hold data with NaN: KV pages on both tiers of every group
    /// that no table names and no prefix-cache entry keeps, adapter pages no resident adapter or
    /// host copy has.
    fn poison(&mut self) -> Result<()> {
        for (g, group) in self.kv.iter_mut().enumerate() {
            let Some(pool) = self.sched.pool(g) else {
                continue;
            };
            let shape = group.kv.shape();
            let mut used = Dirty {
                gpu: vec![false; shape.gpu_pages as usize],
                host: vec![false; shape.host_pages as usize],
            };
            for slot in 0..MAX_REQUESTS as u16 {
                for &e in pool.table(slot).iter().filter(|&&e| e != NO_PAGE) {
                    let (tier, page) = kvsched_core::page_pool::page_of(e);
                    used.tier(tier)[page as usize] = true;
                }
            }
            for tier in [Tier::Gpu, Tier::Host] {
                let flags = used.tier(tier);
                for (page, u) in flags.iter_mut().enumerate() {
                    let info = pool.page_info(entry_of(tier, page as u32));
                    *u |= info.is_some_and(|i| i.cached() || i.refs() > 0 || i.holds() > 0);
                }
            }
            fill_free(&mut group.kv, &mut group.dirty, &mut used)?;
        }
        let shape = self.adapters.shape();
        let mut used = Dirty {
            gpu: vec![false; shape.gpu_pages as usize],
            host: vec![false; shape.host_pages as usize],
        };
        for slot in 0..self.weights.len() as u16 {
            for &p in self.slots.device_pages(TaskSlot(slot)).unwrap_or(&[]) {
                used.gpu[p as usize] = true;
            }
            for &p in self.slots.host_pages(TaskSlot(slot)).unwrap_or(&[]) {
                used.host[p as usize] = true;
            }
        }
        fill_free(&mut self.adapters, &mut self.adapter_dirty, &mut used)
    }
}

/// The adapter device pages of a row's request: those the adapter plan gave its task slot.
fn adapter_pages<'s>(
    tasks: &HashMap<u64, TaskRef>,
    slots: &'s AdapterSlots,
    live: &Live,
    row: &Row,
) -> Result<Option<&'s [u32]>> {
    let Some(id) = live.adapter else {
        return Ok(None);
    };
    let slot = tasks.get(&id).map(|t| t.slot);
    if row.task.is_none() || row.task != slot {
        return Err(EngineError::Adapter(format!(
            "request {}: adapter {id} is on task slot {slot:?}, the batch names {:?}",
            live.id, row.task
        )));
    }
    let pages = row.task.and_then(|t| slots.device_pages(t));
    pages.map(Some).ok_or_else(|| {
        EngineError::Adapter(format!(
            "request {}: adapter {id} is not on the device",
            live.id
        ))
    })
}

/// Nanoseconds since `since` (saturating at `u64::MAX`).
fn nanos(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Writes NaN over every page not `used` that is `dirty`; used pages become dirty.
fn fill_free(store: &mut dyn PageStore, dirty: &mut Dirty, used: &mut Dirty) -> Result<()> {
    let mut page = f32::NAN.to_le_bytes().repeat(store.shape().page_bytes / 4);
    page.resize(store.shape().page_bytes, 0xff);
    for tier in [Tier::Gpu, Tier::Host] {
        let (d, u) = (dirty.tier(tier), used.tier(tier));
        for (p, (d, &u)) in d.iter_mut().zip(u.iter()).enumerate() {
            if u {
                *d = true;
            } else if *d {
                store.write_page(tier, p as u32, &page)?;
                *d = false;
            }
        }
    }
    Ok(())
}
