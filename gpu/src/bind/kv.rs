//! The KV binding: the scheduler's move log as batched offloads and reloads, and the block tables
//! of a scheduled batch.

use kvsched_core::kv::{PageMove, Tier};
use kvsched_core::output::{Listed, SchedulerOutput};
use kvsched_core::page_pool::{KvPool, SeqState};
use kvsched_core::storage::{Buffers, Storage};

use crate::error::MemError;
use crate::page::{CopyEvent, KvMemory};

/// What [`KvPages::apply_moves`] issued for one move log.
#[derive(Debug)]
#[must_use = "wait on the event before the batch's kernels read the moved pages"]
pub struct AppliedMoves {
    /// Pages copied GPU → host.
    pub offloaded: u32,
    /// Pages copied host → GPU.
    pub reloaded: u32,
    /// `offload` / `reload` calls issued (batches; 0 for an empty log, usually 1 or 2).
    pub batches: u32,
    /// Completion of the last batch. With a store whose copies run in order
    /// ([`KvMemory::copies_in_order`]) it completes after every batch; otherwise the earlier
    /// batches were already waited for.
    pub event: CopyEvent,
}

/// What [`KvPages::stage_tables`] uploaded.
#[derive(Debug)]
#[must_use = "wait on the event before the batch's kernels read the block tables"]
pub struct StagedTables {
    /// Rows uploaded: one per scheduled request, in [`block_table_rows`] order.
    pub rows: u32,
    /// Completion of the upload.
    pub event: CopyEvent,
}

/// Counters of a [`KvPages`] binding over its lifetime.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvPageStats {
    /// Pages copied GPU → host.
    pub pages_offloaded: u64,
    /// Pages copied host → GPU.
    pub pages_reloaded: u64,
    /// `offload` calls.
    pub offload_batches: u64,
    /// `reload` calls.
    pub reload_batches: u64,
    /// Move logs that needed more than one offload or more than one reload (a page that a reload
    /// freed and an offload reused, or a cache suspended again after its resume, in one log).
    pub split_logs: u64,
    /// Waits on a batch before issuing the next (stores whose copies may run out of order only).
    pub ordering_waits: u64,
    /// Block-table uploads.
    pub table_uploads: u64,
}

/// The latest batch that read and that wrote a page during one [`KvPages::apply_moves`]:
/// `1 + batch index`, `0` for none.
#[derive(Debug, Clone, Copy, Default)]
struct Access {
    read: u32,
    written: u32,
}

/// Applies the scheduler's page moves and a core [`KvPool`]'s block tables to a [`KvMemory`] store.
///
/// # Moves
///
/// The pool logs one [`PageMove`] per page, in the order it decided them; the engine takes the log
/// with [`Scheduler::take_moves`](kvsched_core::Scheduler::take_moves) (which also settles the
/// requests the pass resumed) and hands it over as is:
///
/// ```text
/// let moved = kv_pages.apply_moves(sched.take_moves(), &mut kv_store)?;
/// ```
///
/// Within one pass a GPU page that a suspension freed is often handed to a resumed request (LIFO
/// free stacks), a host page that a resume freed to the next suspension, and a cache can be
/// suspended and resumed again. [`KvPages::apply_moves`] therefore assigns every move to a *batch*:
/// batches alternate offload, reload, offload, …, and a move goes to the first batch of its
/// direction that comes after every earlier move that wrote its source page, read its target page
/// or wrote its target page. Each batch is one `offload` or `reload` call (moves in log order,
/// consecutive pages merged into one copy by the store). The usual log — suspensions whose GPU
/// pages resumes reuse — becomes one offload followed by one reload; a log without conflicts
/// becomes at most one of each. Batches run in order: on a store whose copies run in issue order
/// ([`KvMemory::copies_in_order`]) by construction, on any other store by waiting on each batch's
/// event before issuing the next.
///
/// # Block tables
///
/// [`KvPages::stage_tables`] stages one row per scheduled request — the GPU page ids of
/// [`KvPool::table`], padded with [`crate::BLOCK_TABLE_PAD`] — and uploads them in one copy.
///
/// # Ordering against compute
///
/// The copies are ordered among themselves, not against kernels. Before `apply_moves`, the previous
/// step's kernels that write KV pages must be done (on CUDA: make
/// [`CudaKvStore::copy_stream`](crate::CudaKvStore::copy_stream) wait on the compute stream's
/// event); before the next step's kernels, wait on the returned events
/// ([`CopyEvent::cuda_event`]).
#[derive(Debug, Default)]
pub struct KvPages {
    /// The log of the last `apply_moves`.
    log: Vec<PageMove>,
    /// `(batch, index into log)`, sorted.
    order: Vec<(u32, u32)>,
    gpu: Vec<Access>,
    host: Vec<Access>,
    batch: Vec<PageMove>,
    stats: KvPageStats,
}

/// The scheduled requests that get a block-table row, in row order: the context chunks (their
/// [`Chunk::listed`](kvsched_core::output::Chunk::listed)), then the generation steps (the batch
/// layout of [`SchedulerOutput`]). Encoder requests have no decoder KV and get no row.
pub fn block_table_rows<const N: usize, S: Storage>(
    out: &SchedulerOutput<N, S>,
) -> impl Iterator<Item = Listed> + '_ {
    let context = out.context().iter().map(|chunk| chunk.listed);
    context.chain(out.generation().iter().copied())
}

impl KvPages {
    /// A binding with empty buffers (they grow to the pool's page counts on first use).
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies a move log (in the order the pool logged it, as
    /// [`Scheduler::take_moves`](kvsched_core::Scheduler::take_moves) hands it over) to `mem`, in
    /// batches (see the type's docs). A page id beyond `mem`'s tiers is refused before anything is
    /// issued; an error from a later batch leaves the earlier batches issued.
    pub fn apply_moves<M: KvMemory + ?Sized>(
        &mut self,
        log: &[PageMove],
        mem: &mut M,
    ) -> Result<AppliedMoves, MemError> {
        self.log.clear();
        self.log.extend_from_slice(log);
        let mut applied = AppliedMoves {
            offloaded: 0,
            reloaded: 0,
            batches: 0,
            event: CopyEvent::complete(),
        };
        if self.log.is_empty() {
            return Ok(applied);
        }
        self.plan(mem.shape())?;
        let in_order = mem.copies_in_order();
        let (mut offloads, mut reloads) = (0u32, 0u32);
        let mut start = 0;
        while start < self.order.len() {
            let batch = self.order[start].0;
            let len = self.order[start..]
                .iter()
                .take_while(|&&(b, _)| b == batch)
                .count();
            self.batch.clear();
            let log = &self.log;
            let moves = self.order[start..start + len].iter();
            self.batch.extend(moves.map(|&(_, i)| log[i as usize]));
            start += len;
            if applied.batches > 0 && !in_order {
                applied.event.wait()?;
                self.stats.ordering_waits += 1;
            }
            let pages = self.batch.len() as u32;
            // Even batches offload, odd batches reload (see `plan`).
            applied.event = if batch % 2 == 0 {
                let event = mem.offload(&self.batch)?;
                applied.offloaded += pages;
                offloads += 1;
                self.stats.pages_offloaded += u64::from(pages);
                self.stats.offload_batches += 1;
                event
            } else {
                let event = mem.reload(&self.batch)?;
                applied.reloaded += pages;
                reloads += 1;
                self.stats.pages_reloaded += u64::from(pages);
                self.stats.reload_batches += 1;
                event
            };
            applied.batches += 1;
        }
        if offloads > 1 || reloads > 1 {
            self.stats.split_logs += 1;
        }
        Ok(applied)
    }

    /// Assigns every move of `self.log` to a batch and fills `self.order` sorted by batch (log
    /// order within a batch). Batch `2k` offloads, batch `2k + 1` reloads.
    fn plan(&mut self, shape: crate::PoolShape) -> Result<(), MemError> {
        for m in &self.log {
            for (tier, page) in [(m.from, m.src), (m.from.other(), m.dst)] {
                let pages = shape.pages(tier);
                if page >= pages {
                    return Err(MemError::PageOutOfRange { tier, page, pages });
                }
            }
        }
        for (tier, accesses) in [(Tier::Gpu, &mut self.gpu), (Tier::Host, &mut self.host)] {
            let pages = shape.pages(tier) as usize;
            if accesses.len() < pages {
                accesses.resize(pages, Access::default());
            }
        }
        self.order.clear();
        for index in 0..self.log.len() {
            let m = self.log[index];
            let (src, dst) = (
                self.access(m.from, m.src),
                self.access(m.from.other(), m.dst),
            );
            // After every earlier write of the source (read after write), read of the target
            // (write after read) and write of the target (write after write; a batch may not name
            // a target twice either).
            let after = src.written.max(dst.read).max(dst.written);
            let parity = match m.from {
                Tier::Gpu => 0,
                Tier::Host => 1,
            };
            let batch = if after % 2 == parity {
                after
            } else {
                after + 1
            };
            let src = self.access_mut(m.from, m.src);
            src.read = src.read.max(batch + 1);
            let dst = self.access_mut(m.from.other(), m.dst);
            dst.written = dst.written.max(batch + 1);
            // Lossless: the log is at most gpu_pages + host_pages long, both u32.
            self.order.push((batch, index as u32));
        }
        // Clear what this log touched, for the next one.
        for index in 0..self.log.len() {
            let m = self.log[index];
            *self.access_mut(m.from, m.src) = Access::default();
            *self.access_mut(m.from.other(), m.dst) = Access::default();
        }
        // Unique keys: the unstable sort keeps log order within a batch and does not allocate.
        self.order.sort_unstable();
        Ok(())
    }

    /// The accesses of `page` of `tier` in the log being planned (in range: checked by `plan`).
    fn access(&self, tier: Tier, page: u32) -> Access {
        match tier {
            Tier::Gpu => self.gpu[page as usize],
            Tier::Host => self.host[page as usize],
        }
    }

    /// The accesses of `page` of `tier`, to update (in range: checked by `plan`).
    fn access_mut(&mut self, tier: Tier, page: u32) -> &mut Access {
        match tier {
            Tier::Gpu => &mut self.gpu[page as usize],
            Tier::Host => &mut self.host[page as usize],
        }
    }

    /// Stages one block-table row per scheduled request ([`block_table_rows`] order: row `r` holds
    /// the GPU pages of the `r`-th request, [`KvPool::table`], padded) and uploads them.
    ///
    /// Refuses a batch with a request whose cache is not active on the GPU (`NotActive`; the pass
    /// never produces one) and, through the store, more requests than block-table rows or a table
    /// longer than a row. Nothing is uploaded then.
    pub fn stage_tables<M: KvMemory + ?Sized, B: Buffers, const N: usize, S: Storage>(
        &mut self,
        pool: &KvPool<'_, B>,
        out: &SchedulerOutput<N, S>,
        mem: &mut M,
    ) -> Result<StagedTables, MemError> {
        let mut rows = 0u32;
        for listed in block_table_rows(out) {
            let slot = listed.slot();
            let seq = pool.seq(slot);
            if seq.state != SeqState::Active {
                return Err(MemError::NotActive { slot });
            }
            mem.stage_block_table(rows, pool.table(slot))?;
            rows += 1;
        }
        let event = mem.upload_block_tables(rows)?;
        self.stats.table_uploads += 1;
        Ok(StagedTables { rows, event })
    }

    /// The move log the last [`KvPages::apply_moves`] applied (for tracing and tests).
    pub fn last_log(&self) -> &[PageMove] {
        &self.log
    }

    /// Lifetime counters.
    pub fn stats(&self) -> KvPageStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BlockTableShape, HostKvStore, PageStore, PoolShape};
    use kvsched_core::ids::RequestId;
    use proptest::prelude::*;

    const PAGE: usize = 8;

    fn offload(src: u32, dst: u32) -> PageMove {
        PageMove {
            request: RequestId(0),
            from: Tier::Gpu,
            src,
            dst,
        }
    }

    fn reload(src: u32, dst: u32) -> PageMove {
        PageMove {
            request: RequestId(0),
            from: Tier::Host,
            src,
            dst,
        }
    }

    fn store(gpu: u32, host: u32) -> HostKvStore {
        let mut mem =
            HostKvStore::new(PoolShape::new(PAGE, gpu, host), BlockTableShape::new(2, 4)).unwrap();
        for (tier, pages) in [(Tier::Gpu, gpu), (Tier::Host, host)] {
            for page in 0..pages {
                mem.write_page(tier, page, &bytes(tier, page)).unwrap();
            }
        }
        mem
    }

    /// The initial content of a page: its tier and id.
    fn bytes(tier: Tier, page: u32) -> Vec<u8> {
        let mut b = vec![page as u8; PAGE];
        b[0] = tier as u8;
        b
    }

    fn page(mem: &HostKvStore, tier: Tier, page: u32) -> Vec<u8> {
        let mut out = vec![0; PAGE];
        mem.read_page(tier, page, &mut out).unwrap();
        out
    }

    #[test]
    fn freed_gpu_page_reused_by_a_reload_is_offloaded_first() {
        // Suspend A (g0 → h0), resume B (h1 → g0): one offload, then one reload.
        let mut mem = store(2, 2);
        let mut kv = KvPages::new();
        let applied = kv
            .apply_moves(&[offload(0, 0), reload(1, 0)], &mut mem)
            .unwrap();
        assert_eq!(
            (applied.offloaded, applied.reloaded, applied.batches),
            (1, 1, 2)
        );
        assert_eq!(page(&mem, Tier::Host, 0), bytes(Tier::Gpu, 0));
        assert_eq!(page(&mem, Tier::Gpu, 0), bytes(Tier::Host, 1));
    }

    #[test]
    fn freed_host_page_reused_by_an_offload_waits_for_the_reload() {
        // Resume B (h0 → g1), then suspend A (g0 → h0): the offload must come after the reload.
        let mut mem = store(2, 1);
        let mut kv = KvPages::new();
        let applied = kv
            .apply_moves(&[reload(0, 1), offload(0, 0)], &mut mem)
            .unwrap();
        assert_eq!(
            applied.batches, 2,
            "an empty first offload batch is skipped"
        );
        assert_eq!(page(&mem, Tier::Gpu, 1), bytes(Tier::Host, 0));
        assert_eq!(page(&mem, Tier::Host, 0), bytes(Tier::Gpu, 0));
        // Both conflicts in one log: offload, reload, offload.
        let mut mem = store(3, 3);
        let log = [offload(0, 0), reload(1, 0), offload(1, 2)];
        let applied = kv.apply_moves(&log, &mut mem).unwrap();
        assert_eq!(
            applied.batches, 2,
            "the second offload conflicts with nothing"
        );
        assert_eq!(page(&mem, Tier::Host, 2), bytes(Tier::Gpu, 1));
        let log = [offload(0, 0), reload(1, 0), offload(2, 1)];
        let mut mem = store(3, 2);
        let applied = kv.apply_moves(&log, &mut mem).unwrap();
        assert_eq!(applied.batches, 3);
        assert_eq!(page(&mem, Tier::Host, 0), bytes(Tier::Gpu, 0));
        assert_eq!(page(&mem, Tier::Gpu, 0), bytes(Tier::Host, 1));
        assert_eq!(page(&mem, Tier::Host, 1), bytes(Tier::Gpu, 2));
        assert_eq!(kv.stats().split_logs, 1);
        assert_eq!(kv.last_log(), &log);
    }

    #[test]
    fn suspended_and_resumed_in_one_log() {
        // g0 → h0 → g1 → h1: every hop after the previous one.
        let mut mem = store(2, 2);
        let mut kv = KvPages::new();
        let log = [offload(0, 0), reload(0, 1), offload(1, 1)];
        let applied = kv.apply_moves(&log, &mut mem).unwrap();
        assert_eq!(applied.batches, 3);
        assert_eq!(page(&mem, Tier::Host, 1), bytes(Tier::Gpu, 0));
    }

    #[test]
    fn out_of_range_pages_issue_nothing() {
        let mut mem = store(2, 2);
        let mut kv = KvPages::new();
        let error = kv
            .apply_moves(&[offload(0, 0), reload(0, 2)], &mut mem)
            .unwrap_err();
        assert_eq!(
            error,
            MemError::PageOutOfRange {
                tier: Tier::Gpu,
                page: 2,
                pages: 2
            }
        );
        assert_eq!(
            page(&mem, Tier::Host, 0),
            bytes(Tier::Host, 0),
            "nothing issued"
        );
        let applied = kv.apply_moves(&[], &mut mem).unwrap();
        assert_eq!(applied.batches, 0);
        assert!(applied.event.is_complete().unwrap());
    }

    /// One logical step of a two-tier pool: move the block at position `pick` of the blocks on
    /// `from` to the most recently freed page of the other tier (LIFO free stacks, as the core's).
    #[derive(Clone, Debug)]
    struct Step {
        offload: bool,
        pick: usize,
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

        /// Any sequence of page moves of a consistent pool (each block lives in one page, targets
        /// are free pages) leaves every block's bytes at its final page, whatever the batching.
        #[test]
        fn batched_moves_equal_the_log_in_order(
            gpu in 1u32..8,
            host in 1u32..8,
            steps in prop::collection::vec((any::<bool>(), 0usize..16).prop_map(|(offload, pick)| Step { offload, pick }), 0..40),
        ) {
            let mut mem = store(gpu, host);
            // Blocks start on the GPU pages (half of them) with their initial bytes.
            let mut blocks: Vec<(Tier, u32, Vec<u8>)> =
                (0..gpu.div_ceil(2)).map(|p| (Tier::Gpu, p, bytes(Tier::Gpu, p))).collect();
            let mut free_gpu: Vec<u32> = (gpu.div_ceil(2)..gpu).rev().collect();
            let mut free_host: Vec<u32> = (0..host).rev().collect();
            let mut log = Vec::new();
            for step in &steps {
                let from = if step.offload { Tier::Gpu } else { Tier::Host };
                let on: Vec<usize> = (0..blocks.len()).filter(|&b| blocks[b].0 == from).collect();
                let (source_free, target_free) = match from {
                    Tier::Gpu => (&mut free_gpu, &mut free_host),
                    Tier::Host => (&mut free_host, &mut free_gpu),
                };
                if on.is_empty() || target_free.is_empty() {
                    continue;
                }
                let block = on[step.pick % on.len()];
                let target = target_free.pop().unwrap();
                let source = blocks[block].1;
                source_free.push(source);
                log.push(if step.offload { offload(source, target) } else { reload(source, target) });
                let to = if step.offload { Tier::Host } else { Tier::Gpu };
                blocks[block].0 = to;
                blocks[block].1 = target;
            }
            let mut kv = KvPages::new();
            let applied = kv.apply_moves(&log, &mut mem).unwrap();
            prop_assert_eq!((applied.offloaded + applied.reloaded) as usize, log.len());
            for (tier, page_id, expected) in &blocks {
                prop_assert_eq!(&page(&mem, *tier, *page_id), expected);
            }
            // The access tracker is left clear for the next log.
            prop_assert!(kv.gpu.iter().chain(&kv.host).all(|a| a.read == 0 && a.written == 0));
        }
    }
}
