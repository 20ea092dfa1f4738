//! The step's batch: its rows (a context chunk or a generation step each) and each row's page tables,
//! kept from step to step and brought up to date from the scheduler's batch delta
//! ([`kvsched_core::BatchDelta`]), as vLLM's model runner keeps a persistent batch.
//!
//! Each step, [`Engine::prepare_batch`]:
//!
//! 1. drops the rows of the requests that left the batch or whose entry changed (every context chunk
//!    is a new entry; so is a request that moved from one list to another);
//! 2. builds a row for each context chunk and for each generation step that entered or changed, from
//!    the output's lists, checking it against what the engine knows of the request;
//! 3. moves every other generation row on by the tokens its last step took (its position is the
//!    request's last token, its length that token and its drafts), and copies a row's group-0 page
//!    table again only when the pool's table grew or shrank (a page boundary, a rewind); a window
//!    group's table, whose leading entries are released as the window slides, is copied every step.
//!
//! With [`EngineConfig::rebuild_batch`](super::EngineConfig::rebuild_batch) every step rebuilds the
//! whole batch from the output's lists instead (the peer [`EngineStats::prep_ns`] is compared with).
//! In a debug build the persistent batch is checked against that rebuild after every step: the same
//! rows (in an order of their own) with the same tables.
//!
//! [`EngineStats::prep_ns`]: super::EngineStats::prep_ns

use super::{backend, gpu_pages_into, listed_live, Engine, Live, Row, MAX_REQUESTS};
use crate::error::{EngineError, Result};
use kvsched_core::delta::BatchDelta;
use kvsched_core::output::{Chunk, Listed};
use kvsched_core::page_pool::NO_PAGE;
use kvsched_core::storage::Boxed;

/// The delta the engine's batch is brought up to date with.
pub(super) type Delta = BatchDelta<MAX_REQUESTS, Boxed>;

/// The rows of the step and their page tables (`tables[i]` and `locals[i]` are row `i`'s).
#[derive(Debug, Default)]
pub(super) struct Persistent {
    pub(super) rows: Vec<Row>,
    /// Group 0's GPU pages per row.
    pub(super) tables: Vec<Vec<u32>>,
    /// Group 1's (the window group of a grouped engine) per row; empty for a full-only engine.
    pub(super) locals: Vec<Vec<u32>>,
    /// Per table slot: the index of its row.
    at: Vec<Option<usize>>,
}

impl Persistent {
    pub(super) fn new() -> Self {
        Self {
            rows: Vec::with_capacity(MAX_REQUESTS),
            tables: Vec::with_capacity(MAX_REQUESTS),
            locals: Vec::with_capacity(MAX_REQUESTS),
            at: vec![None; MAX_REQUESTS],
        }
    }

    /// Drops `slot`'s row (the last row takes its place).
    fn drop_row(&mut self, slot: u16) -> Result<()> {
        let i = self.at[usize::from(slot)]
            .take()
            .ok_or_else(|| EngineError::Batch(format!("slot {slot} left a batch it was not in")))?;
        self.rows.swap_remove(i);
        self.tables.swap_remove(i);
        if !self.locals.is_empty() {
            self.locals.swap_remove(i);
        }
        if let Some(moved) = self.rows.get(i) {
            self.at[usize::from(moved.slot)] = Some(i);
        }
        Ok(())
    }

    fn push(&mut self, row: Row, tables: (Vec<u32>, Option<Vec<u32>>)) -> Result<()> {
        let at = &mut self.at[usize::from(row.slot)];
        if at.is_some() {
            let slot = row.slot;
            return Err(EngineError::Batch(format!(
                "slot {slot} is in the batch twice"
            )));
        }
        *at = Some(self.rows.len());
        self.rows.push(row);
        self.tables.push(tables.0);
        if let Some(local) = tables.1 {
            self.locals.push(local);
        }
        Ok(())
    }

    fn clear(&mut self) {
        self.rows.clear();
        self.tables.clear();
        self.locals.clear();
        self.at.iter_mut().for_each(|a| *a = None);
    }
}

impl Engine<'_> {
    /// The step's rows and page tables in `self.batch`: the delta applied to the last step's, or (with
    /// `rebuild_batch`) rebuilt from the output's lists.
    pub(super) fn prepare_batch(&mut self) -> Result<()> {
        if self.cfg.rebuild_batch {
            return self.rebuild_batch();
        }
        self.sched.take_delta(&self.out, &mut self.delta)?;
        // Out of `self` while it is brought up to date (an empty batch holds no memory).
        let mut batch = std::mem::take(&mut self.batch);
        let applied = self.apply_delta(&mut batch);
        self.batch = batch;
        applied?;
        #[cfg(debug_assertions)]
        self.check_batch()?;
        Ok(())
    }

    /// Every row built again from the output's lists.
    fn rebuild_batch(&mut self) -> Result<()> {
        let mut batch = std::mem::take(&mut self.batch);
        batch.clear();
        let built = self.build_all(&mut batch);
        self.batch = batch;
        built
    }

    fn build_all(&self, batch: &mut Persistent) -> Result<()> {
        for c in self.out.context() {
            let row = self.context_row(c)?;
            batch.push(row, self.tables_of(row.slot)?)?;
        }
        for &l in self.out.generation() {
            let row = self.generation_row(l)?;
            batch.push(row, self.tables_of(row.slot)?)?;
        }
        Ok(())
    }

    fn apply_delta(&self, batch: &mut Persistent) -> Result<()> {
        let delta = &self.delta;
        for l in delta.left().iter().chain(delta.changed()) {
            batch.drop_row(l.slot())?;
        }
        let fresh = delta.entered().len() + delta.changed().len();
        // Every context chunk entered or changed; a generation step only when one did.
        for c in self.out.context() {
            let row = self.context_row(c)?;
            batch.push(row, self.tables_of(row.slot)?)?;
        }
        if fresh > self.out.context().len() {
            for &l in self.out.generation() {
                if batch.at[usize::from(l.slot())].is_none() {
                    let row = self.generation_row(l)?;
                    batch.push(row, self.tables_of(row.slot)?)?;
                }
            }
        }
        self.step_generation_rows(batch)
    }

    /// Every generation row at its request's next step; group 0's table copied again when its length
    /// changed, the window group's every step.
    fn step_generation_rows(&self, batch: &mut Persistent) -> Result<()> {
        let grouped = self.sched.grouped();
        for (i, row) in batch.rows.iter_mut().enumerate() {
            if row.context {
                continue;
            }
            let live = self.live_at(row.slot)?;
            *row = self.next_step(row, live)?;
            let table = self.pool(0)?.table(row.slot);
            let cached = &mut batch.tables[i];
            // The cached table holds GPU page ids, the pool's entries: on the GPU tier they are equal.
            if cached.len() != table.len() || cached.last() != table.last() {
                gpu_pages_into(table, row.slot, false, cached)?;
            }
            if grouped {
                let table = self.pool(1)?.table(row.slot);
                gpu_pages_into(table, row.slot, true, &mut batch.locals[i])?;
            }
        }
        Ok(())
    }

    /// A context chunk's row: tokens `position..position + tokens` of its request.
    fn context_row(&self, c: &Chunk) -> Result<Row> {
        let live = listed_live(&self.live, c.listed)?;
        let start = self.sched.get(c.listed.handle())?.spec().position as usize;
        let (len, total) = (c.tokens as usize, live.tokens.len());
        if len == 0 || start + len > total || c.last != (start + len == total) {
            return lost(
                live,
                &format!("a chunk of {len} at {start} of {total} tokens"),
            );
        }
        if live.computed != 0 && start != live.computed {
            return lost(
                live,
                &format!("a chunk at {start}, {} computed", live.computed),
            );
        }
        Ok(Row {
            slot: c.listed.slot(),
            start,
            len,
            logits: c.last,
            task: c.listed.task_slot(),
            context: true,
        })
    }

    /// A generation step's row: the request's last token and its drafts.
    fn generation_row(&self, l: Listed) -> Result<Row> {
        let live = listed_live(&self.live, l)?;
        let row = Row {
            slot: l.slot(),
            start: 0,
            len: 1,
            logits: true,
            task: l.task_slot(),
            context: false,
        };
        self.next_step(&row, live)
    }

    /// `row` moved to `live`'s next decode step, checked against the drafts the pass scheduled.
    fn next_step(&self, row: &Row, live: &Live) -> Result<Row> {
        if live.computed + 1 != live.tokens.len() {
            let (c, t) = (live.computed, live.tokens.len());
            return lost(
                live,
                &format!("a decode step with {c} of {t} tokens computed"),
            );
        }
        if self.cfg.speculative.is_some() {
            let drafts = self.sched.get(live.handle)?.spec().draft as usize;
            if drafts != live.draft.len() {
                let d = live.draft.len();
                return lost(live, &format!("{drafts} drafts scheduled, {d} proposed"));
            }
        }
        Ok(Row {
            start: live.tokens.len() - 1,
            len: 1 + live.draft.len(),
            ..*row
        })
    }

    /// A slot's GPU pages in group 0 and, on a grouped engine, in the window group.
    fn tables_of(&self, slot: u16) -> Result<(Vec<u32>, Option<Vec<u32>>)> {
        let mut global = Vec::new();
        gpu_pages_into(self.pool(0)?.table(slot), slot, false, &mut global)?;
        let local = if self.sched.grouped() {
            let mut local = Vec::new();
            gpu_pages_into(self.pool(1)?.table(slot), slot, true, &mut local)?;
            Some(local)
        } else {
            None
        };
        Ok((global, local))
    }

    fn pool(&self, g: usize) -> Result<&backend::Pool> {
        self.sched
            .pool(g)
            .ok_or_else(|| EngineError::Batch(format!("no KV group {g}")))
    }

    fn live_at(&self, slot: u16) -> Result<&Live> {
        self.live[usize::from(slot)]
            .as_ref()
            .ok_or_else(|| EngineError::Batch(format!("slot {slot} is empty")))
    }

    /// Marks every page of the batch's tables dirty in its group's store (the poison check fills a
    /// free page only once something may have written it).
    pub(super) fn mark_dirty(&mut self) {
        let tables = [&self.batch.tables, &self.batch.locals];
        for (group, tables) in self.kv.iter_mut().zip(tables) {
            for &p in tables.iter().flatten().filter(|&&p| p != NO_PAGE) {
                group.dirty.gpu[p as usize] = true;
            }
        }
    }

    /// The persistent batch is the rebuilt one: the same rows with the same tables.
    #[cfg(debug_assertions)]
    fn check_batch(&self) -> Result<()> {
        let mut want = Persistent::new();
        self.build_all(&mut want)?;
        let key = |b: &Persistent| {
            let mut rows: Vec<_> = (0..b.rows.len())
                .map(|i| {
                    let r = b.rows[i];
                    let local = b.locals.get(i).cloned();
                    (
                        r.slot,
                        r.start,
                        r.len,
                        r.logits,
                        r.task,
                        r.context,
                        b.tables[i].clone(),
                        local,
                    )
                })
                .collect();
            rows.sort_by_key(|r| r.0);
            rows
        };
        if key(&self.batch) == key(&want) {
            Ok(())
        } else {
            Err(EngineError::Batch(format!(
                "the persistent batch is not the output's: {:?} against {:?}",
                key(&self.batch),
                key(&want)
            )))
        }
    }
}

fn lost<T>(live: &Live, what: &str) -> Result<T> {
    Err(EngineError::Batch(format!("request {}: {what}", live.id)))
}
