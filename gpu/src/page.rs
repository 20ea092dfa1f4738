//! The backend-independent part: shapes, page moves, page math, validation and the traits.

use core::ops::Range;

#[cfg(feature = "cuda")]
use cudarc::driver::CudaEvent;
use kvsched_core::kv::{PageMove, Tier};
use kvsched_core::page_pool::NO_PAGE;

use crate::error::MemError;

/// Block-table entry for "no page": rows are padded with it after a request's last page.
pub const BLOCK_TABLE_PAD: i32 = -1;

/// The size of a two-tier page pool: bytes per page, pages per tier, and how a page is laid out.
///
/// A tier may have zero pages (a KV pool without a host tier); its moves are then refused.
///
/// With `layers = 1` (the default) page `p` of a tier is the contiguous bytes `p * page_bytes ..`.
/// A *layer-major* tier (`layers = L > 1`, as engines that keep one KV tensor per layer lay it out)
/// holds L regions of `pages * piece_bytes` bytes, one per layer, `piece_bytes = page_bytes / L`; the
/// logical page `p` is the L pieces at `l * pages * piece_bytes + p * piece_bytes`. Page reads and
/// writes gather and scatter the pieces in layer order; a move copies every layer of each run of
/// pages ([`copy_pieces`](crate::copy_pieces)), in one call of the batched copy or the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolShape {
    /// Bytes in one page (all tiers; all layers of a layer-major page).
    pub page_bytes: usize,
    /// Pages in the GPU tier.
    pub gpu_pages: u32,
    /// Pages in the host tier.
    pub host_pages: u32,
    /// Pieces a page is split into, one per layer (1: contiguous pages).
    pub layers: u32,
}

/// The shape of the KV store's page pool (alias kept for readability at call sites).
pub type KvShape = PoolShape;
/// The shape of the adapter store's page pool (alias kept for readability at call sites).
pub type AdapterShape = PoolShape;

impl PoolShape {
    /// A shape of `gpu_pages` GPU pages and `host_pages` host pages of `page_bytes` contiguous bytes.
    pub const fn new(page_bytes: usize, gpu_pages: u32, host_pages: u32) -> Self {
        Self {
            page_bytes,
            gpu_pages,
            host_pages,
            layers: 1,
        }
    }

    /// The same shape, layer-major with `layers` pieces a page (`page_bytes` must divide by it).
    pub const fn with_layers(self, layers: u32) -> Self {
        Self { layers, ..self }
    }

    /// Bytes of one layer's piece of a page.
    pub const fn piece_bytes(&self) -> usize {
        self.page_bytes
            / if self.layers == 0 {
                1
            } else {
                self.layers as usize
            }
    }

    /// Pages in `tier`.
    pub const fn pages(&self, tier: Tier) -> u32 {
        match tier {
            Tier::Gpu => self.gpu_pages,
            Tier::Host => self.host_pages,
        }
    }

    /// Bytes in `tier` (`pages * page_bytes`, saturating; exact for a validated shape).
    pub const fn tier_bytes(&self, tier: Tier) -> usize {
        (self.pages(tier) as usize).saturating_mul(self.page_bytes)
    }

    /// Checks that both tiers can be allocated and that GPU page ids fit a block-table entry.
    pub fn validate(&self) -> Result<(), MemError> {
        if self.page_bytes == 0 {
            return Err(MemError::InvalidShape {
                reason: "page_bytes is zero",
            });
        }
        if self.layers == 0 || self.page_bytes % self.layers as usize != 0 {
            return Err(MemError::InvalidShape {
                reason: "layers must be at least 1 and divide page_bytes",
            });
        }
        if i32::try_from(self.gpu_pages).is_err() {
            return Err(MemError::InvalidShape {
                reason: "GPU page ids must fit an i32 block-table entry",
            });
        }
        for tier in [Tier::Gpu, Tier::Host] {
            byte_len(self.pages(tier) as usize, self.page_bytes)?;
        }
        Ok(())
    }

    /// The byte ranges of `page` in `tier`, one per layer in layer order (one range for contiguous
    /// pages), or `PageOutOfRange`.
    pub fn page_pieces(
        &self,
        tier: Tier,
        page: u32,
    ) -> Result<impl Iterator<Item = Range<usize>>, MemError> {
        let pages = self.pages(tier);
        if page >= pages {
            return Err(MemError::PageOutOfRange { tier, page, pages });
        }
        // Below `tier_bytes`, so no overflow on a validated shape; refused on an unvalidated one.
        if self.validate().is_err() {
            return Err(MemError::InvalidShape {
                reason: "allocation size overflows isize",
            });
        }
        let piece = self.piece_bytes();
        let stride = pages as usize * piece;
        let start = page as usize * piece;
        Ok((0..self.layers as usize).map(move |l| {
            let at = l * stride + start;
            at..at + piece
        }))
    }
}

/// The shape of the per-request block tables: `rows` rows of `width` `i32` page indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockTableShape {
    /// Rows (requests in one batch).
    pub rows: u32,
    /// Entries per row (the most pages one request can hold).
    pub width: u32,
}

impl BlockTableShape {
    /// `rows` rows of `width` entries.
    pub const fn new(rows: u32, width: u32) -> Self {
        Self { rows, width }
    }

    /// Entries in the whole table (`rows * width`, saturating; exact for a validated shape).
    pub const fn entries(&self) -> usize {
        (self.rows as usize).saturating_mul(self.width as usize)
    }

    /// Checks that the table can be allocated.
    pub fn validate(&self) -> Result<(), MemError> {
        byte_len(self.entries(), core::mem::size_of::<i32>()).map(drop)
    }

    /// Checks a row index and a page list against the table and the GPU tier.
    pub(crate) fn check_row(
        &self,
        gpu_pages: u32,
        row: u32,
        pages: &[u32],
    ) -> Result<(), MemError> {
        if row >= self.rows {
            return Err(MemError::RowOutOfRange {
                row,
                rows: self.rows,
            });
        }
        if pages.len() > self.width as usize {
            return Err(MemError::RowTooLong {
                len: pages.len(),
                width: self.width,
            });
        }
        // A sliding-window table's released entries name no page (encoded as the pad).
        match pages
            .iter()
            .find(|&&page| page >= gpu_pages && page != NO_PAGE)
        {
            Some(&page) => Err(MemError::PageOutOfRange {
                tier: Tier::Gpu,
                page,
                pages: gpu_pages,
            }),
            None => Ok(()),
        }
    }

    /// The entry range of `row` (checked by `check_row` first).
    pub(crate) fn row_range(&self, row: u32) -> Range<usize> {
        let start = row as usize * self.width as usize;
        start..start + self.width as usize
    }

    /// The entries of the first `rows` rows, or `RowOutOfRange` when `rows` exceeds the table.
    pub(crate) fn prefix(&self, rows: u32) -> Result<usize, MemError> {
        if rows > self.rows {
            return Err(MemError::RowOutOfRange {
                row: rows,
                rows: self.rows,
            });
        }
        Ok(rows as usize * self.width as usize)
    }
}

/// Writes `pages` into `row` and pads the rest with [`BLOCK_TABLE_PAD`] (pages checked before; a
/// released entry, `NO_PAGE`, is written as the pad too).
pub(crate) fn encode_row(row: &mut [i32], pages: &[u32]) {
    let (head, tail) = row.split_at_mut(pages.len());
    for (entry, &page) in head.iter_mut().zip(pages) {
        // `check_row` bounded `page` by the GPU page count, which `validate` bounded by i32::MAX,
        // or it is `NO_PAGE`, which does not fit.
        *entry = i32::try_from(page).unwrap_or(BLOCK_TABLE_PAD);
    }
    tail.fill(BLOCK_TABLE_PAD);
}

/// `count * size` as a byte length that any allocator (and cudarc's pinned allocator) accepts.
fn byte_len(count: usize, size: usize) -> Result<usize, MemError> {
    match count.checked_mul(size) {
        Some(bytes) if isize::try_from(bytes).is_ok() => Ok(bytes),
        _ => Err(MemError::InvalidShape {
            reason: "allocation size overflows isize",
        }),
    }
}

/// Which way a batch of page moves goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// GPU → host (KV suspend).
    Offload,
    /// Host → GPU (KV resume, adapter upload).
    Reload,
}

impl Direction {
    /// (source tier, target tier).
    pub(crate) const fn tiers(self) -> (Tier, Tier) {
        match self {
            Self::Offload => (Tier::Gpu, Tier::Host),
            Self::Reload => (Tier::Host, Tier::Gpu),
        }
    }
}

/// Validates move lists without allocating: a reusable bitmap of target pages.
#[derive(Debug)]
pub(crate) struct MoveChecker {
    seen: Vec<u64>,
}

impl MoveChecker {
    /// A checker for pools up to `shape`'s larger tier.
    pub(crate) fn new(shape: &PoolShape) -> Self {
        let pages = shape.gpu_pages.max(shape.host_pages) as usize;
        Self {
            seen: vec![0; pages.div_ceil(64)],
        }
    }

    /// Refuses a move list with a move from the wrong tier, a page out of range or a repeated
    /// target; the bitmap is left clear.
    pub(crate) fn check(
        &mut self,
        shape: &PoolShape,
        direction: Direction,
        moves: &[PageMove],
    ) -> Result<(), MemError> {
        let (source_tier, target_tier) = direction.tiers();
        let (source_pages, target_pages) = (shape.pages(source_tier), shape.pages(target_tier));
        let mut result = Ok(());
        let mut marked = 0;
        for page_move in moves {
            if page_move.from != source_tier {
                result = Err(MemError::WrongSourceTier {
                    expected: source_tier,
                    found: page_move.from,
                    page: page_move.src,
                });
                break;
            }
            if page_move.src >= source_pages {
                let (tier, page, pages) = (source_tier, page_move.src, source_pages);
                result = Err(MemError::PageOutOfRange { tier, page, pages });
                break;
            }
            if page_move.dst >= target_pages {
                let (tier, page, pages) = (target_tier, page_move.dst, target_pages);
                result = Err(MemError::PageOutOfRange { tier, page, pages });
                break;
            }
            let (word, bit) = bit_of(page_move.dst);
            if self.seen[word] & bit != 0 {
                result = Err(MemError::DuplicateTarget {
                    tier: target_tier,
                    page: page_move.dst,
                });
                break;
            }
            self.seen[word] |= bit;
            marked += 1;
        }
        for page_move in &moves[..marked] {
            let (word, bit) = bit_of(page_move.dst);
            self.seen[word] &= !bit;
        }
        result
    }
}

fn bit_of(page: u32) -> (usize, u64) {
    ((page / 64) as usize, 1 << (page % 64))
}

/// A run of `pages` consecutive pages copied in one call: `source..source+pages` to
/// `target..target+pages`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRun {
    /// First source page.
    pub source: u32,
    /// First target page.
    pub target: u32,
    /// Pages in the run (at least 1).
    pub pages: u32,
}

impl PageRun {
    /// Byte ranges `(source, target)` of the run for pages of `page_bytes` bytes.
    pub const fn byte_ranges(&self, page_bytes: usize) -> (Range<usize>, Range<usize>) {
        let len = self.pages as usize * page_bytes;
        let source = self.source as usize * page_bytes;
        let target = self.target as usize * page_bytes;
        (source..source + len, target..target + len)
    }
}

/// Merges consecutive moves whose source page (`src`) and target page (`dst`) both advance by one
/// page into runs, keeping the list order. The number of runs is the number of copy calls a backend
/// issues. Only page ids are looked at: the moves' tiers (`from`) and requests are the caller's to
/// check (the stores refuse a move from the wrong tier before they copy anything).
pub fn page_runs(moves: &[PageMove]) -> PageRuns<'_> {
    PageRuns { moves }
}

/// Iterator over the [`PageRun`]s of a move list; see [`page_runs`].
#[derive(Clone, Debug)]
pub struct PageRuns<'a> {
    moves: &'a [PageMove],
}

impl Iterator for PageRuns<'_> {
    type Item = PageRun;

    fn next(&mut self) -> Option<PageRun> {
        let (first, rest) = self.moves.split_first()?;
        let mut run = PageRun {
            source: first.src,
            target: first.dst,
            pages: 1,
        };
        let extends = rest.iter().take_while(|page_move| {
            let next_source = run.source.checked_add(run.pages);
            let next_target = run.target.checked_add(run.pages);
            let extends = next_source == Some(page_move.src) && next_target == Some(page_move.dst);
            run.pages += u32::from(extends);
            extends
        });
        let taken = extends.count();
        self.moves = &rest[taken..];
        Some(run)
    }
}

/// Completion of a batch of copies: wait on it before touching the target pages (or, in the CUDA
/// backend, make another stream wait on [`CopyEvent::cuda_event`]).
///
/// The host backend copies synchronously and hands back an event that is already complete.
#[derive(Debug)]
#[must_use = "wait on the copy before reading or reusing its pages"]
pub struct CopyEvent {
    #[cfg(feature = "cuda")]
    event: Option<CudaEvent>,
}

impl CopyEvent {
    /// An event with no pending work.
    pub const fn complete() -> Self {
        Self {
            #[cfg(feature = "cuda")]
            event: None,
        }
    }

    /// An event recorded on a CUDA stream after the copies.
    #[cfg(feature = "cuda")]
    pub(crate) const fn recorded(event: CudaEvent) -> Self {
        Self { event: Some(event) }
    }

    /// Blocks until the copies are done.
    pub fn wait(&self) -> Result<(), MemError> {
        #[cfg(feature = "cuda")]
        if let Some(event) = &self.event {
            return event.synchronize().map_err(MemError::Driver);
        }
        Ok(())
    }

    /// Whether the copies are done, without blocking.
    pub fn is_complete(&self) -> Result<bool, MemError> {
        #[cfg(feature = "cuda")]
        if let Some(event) = &self.event {
            return event.try_is_complete().map_err(MemError::Driver);
        }
        Ok(true)
    }

    /// The CUDA event, for `CudaStream::wait` on a compute stream; `None` when nothing is pending.
    #[cfg(feature = "cuda")]
    pub const fn cuda_event(&self) -> Option<&CudaEvent> {
        self.event.as_ref()
    }
}

/// A two-tier page pool: raw pages of a fixed size in a GPU tier and a host tier.
///
/// Reads and writes are synchronous helpers for tests, warm-up and loading weights; they wait
/// for pending copies of the store first.
pub trait PageStore {
    /// The pool's shape.
    fn shape(&self) -> PoolShape;

    /// Copies page `page` of `tier` into `out` (`out.len()` must be `page_bytes`).
    fn read_page(&self, tier: Tier, page: u32, out: &mut [u8]) -> Result<(), MemError>;

    /// Copies `data` (`page_bytes` long) into page `page` of `tier`.
    fn write_page(&mut self, tier: Tier, page: u32, data: &[u8]) -> Result<(), MemError>;

    /// Blocks until every copy issued by this store is done.
    fn synchronize(&self) -> Result<(), MemError>;

    /// The byte offset of `page` (of its first layer's piece, for a layer-major shape) from the start
    /// of `tier`'s allocation.
    fn page_offset(&self, tier: Tier, page: u32) -> Result<usize, MemError> {
        let mut pieces = self.shape().page_pieces(tier, page)?;
        Ok(pieces.next().map_or(0, |range| range.start))
    }
}

/// The KV cache's memory: suspend/resume page moves and per-request block tables.
///
/// Moves are kvsched-core's [`PageMove`]s: page `src` of tier `from` goes to page `dst` of the
/// other tier. The stores copy bytes only; `request` is not looked at.
pub trait KvMemory: PageStore {
    /// Starts copying GPU pages to host pages (suspend): every move must come `from`
    /// [`Tier::Gpu`]. Refuses the whole list, issuing nothing, when a move comes from the host tier
    /// (`WrongSourceTier`), a page is out of range or a host page is targeted twice.
    fn offload(&mut self, moves: &[PageMove]) -> Result<CopyEvent, MemError>;

    /// Starts copying host pages to GPU pages (resume): every move must come `from`
    /// [`Tier::Host`]; same checks as [`KvMemory::offload`].
    fn reload(&mut self, moves: &[PageMove]) -> Result<CopyEvent, MemError>;

    /// Whether offloads and reloads run in the order they were issued (one copy queue), so a copy
    /// may read or overwrite a page an earlier copy of this store reads or writes without waiting on
    /// the earlier copy's [`CopyEvent`]. Both backends here do (the host backend copies
    /// synchronously, the CUDA backend issues every move on one copy stream); the default, `false`,
    /// makes [`crate::bind::KvPages`] wait between dependent batches.
    fn copies_in_order(&self) -> bool {
        false
    }

    /// The block-table shape.
    fn block_table_shape(&self) -> BlockTableShape;

    /// Writes one request's GPU page list into row `row` of the staging table, padded with
    /// [`BLOCK_TABLE_PAD`]. An entry a sliding window released
    /// ([`NO_PAGE`](kvsched_core::page_pool::NO_PAGE)) is written as the pad. Visible to kernels
    /// after [`KvMemory::upload_block_tables`].
    fn stage_block_table(&mut self, row: u32, pages: &[u32]) -> Result<(), MemError>;

    /// Starts uploading the first `rows` staged rows into the device block table.
    fn upload_block_tables(&mut self, rows: u32) -> Result<CopyEvent, MemError>;

    /// Reads the first `rows` rows of the device block table into `out` (`rows * width` entries),
    /// after pending uploads.
    fn read_block_tables(&self, rows: u32, out: &mut [i32]) -> Result<(), MemError>;
}

/// The adapter cache's memory: adapter weights in host pages, uploaded into device pages.
///
/// Evicting an adapter from the device needs no copy: its device pages are simply reused.
pub trait AdapterMemory: PageStore {
    /// Starts copying host adapter pages to device adapter pages: every move must come `from`
    /// [`Tier::Host`] (`src` a host page, `dst` a device page); same checks as
    /// [`KvMemory::offload`]. The moves' `request` field is not looked at (an adapter copy belongs
    /// to no request; [`crate::AdapterSlots`] sets it to the task id, for tracing).
    fn upload_adapter(&mut self, moves: &[PageMove]) -> Result<CopyEvent, MemError>;
}

/// `LengthMismatch` unless `actual == expected`.
pub(crate) fn check_len(expected: usize, actual: usize) -> Result<(), MemError> {
    if expected == actual {
        Ok(())
    } else {
        Err(MemError::LengthMismatch { expected, actual })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Moves `(src, dst)` from tier `from`.
    fn moves_from(from: Tier, pairs: &[(u32, u32)]) -> Vec<PageMove> {
        pairs
            .iter()
            .map(|&(src, dst)| PageMove {
                request: kvsched_core::RequestId(7),
                from,
                src,
                dst,
            })
            .collect()
    }

    /// GPU → host moves.
    fn moves(pairs: &[(u32, u32)]) -> Vec<PageMove> {
        moves_from(Tier::Gpu, pairs)
    }

    #[test]
    fn runs_merge_only_consecutive_pairs() {
        let list = moves(&[(0, 5), (1, 6), (2, 7), (9, 8), (3, 9), (4, 10), (4, 11)]);
        let runs: Vec<PageRun> = page_runs(&list).collect();
        assert_eq!(
            runs,
            [
                PageRun {
                    source: 0,
                    target: 5,
                    pages: 3
                },
                PageRun {
                    source: 9,
                    target: 8,
                    pages: 1
                },
                PageRun {
                    source: 3,
                    target: 9,
                    pages: 2
                },
                PageRun {
                    source: 4,
                    target: 11,
                    pages: 1
                },
            ]
        );
        let pages: u32 = runs.iter().map(|run| run.pages).sum();
        assert_eq!(pages as usize, list.len());
        assert_eq!(page_runs(&[]).count(), 0);
    }

    #[test]
    fn runs_stop_at_u32_max() {
        let list = moves(&[(u32::MAX, 0), (0, 1)]);
        assert_eq!(page_runs(&list).count(), 2);
    }

    #[test]
    fn run_byte_ranges() {
        let run = PageRun {
            source: 2,
            target: 0,
            pages: 3,
        };
        assert_eq!(run.byte_ranges(16), (32..80, 0..48));
    }

    #[test]
    fn shape_validation() {
        assert!(PoolShape::new(64, 4, 0).validate().is_ok());
        assert_eq!(
            PoolShape::new(0, 4, 4).validate(),
            Err(MemError::InvalidShape {
                reason: "page_bytes is zero"
            })
        );
        assert!(PoolShape::new(usize::MAX / 2, 4, 0).validate().is_err());
        assert!(PoolShape::new(1, u32::MAX, 0).validate().is_err());
        assert!(BlockTableShape::new(u32::MAX, u32::MAX).validate().is_err());
        assert!(BlockTableShape::new(0, 0).validate().is_ok());
    }

    #[test]
    fn page_piece_math() {
        let pieces = |shape: PoolShape, tier, page| {
            shape
                .page_pieces(tier, page)
                .map(std::iter::Iterator::collect::<Vec<_>>)
        };
        let shape = PoolShape::new(100, 3, 2);
        let single = |r: Range<usize>| Ok(std::iter::once(r).collect::<Vec<_>>());
        assert_eq!(pieces(shape, Tier::Gpu, 2), single(200..300));
        assert_eq!(pieces(shape, Tier::Host, 1), single(100..200));
        assert_eq!(
            pieces(shape, Tier::Host, 2),
            Err(MemError::PageOutOfRange {
                tier: Tier::Host,
                page: 2,
                pages: 2
            })
        );
        // Layer-major: 4 layers of 25 bytes; the GPU tier's layer regions are 3 pages long, the host
        // tier's 2.
        let layered = shape.with_layers(4);
        assert_eq!(layered.piece_bytes(), 25);
        assert_eq!(
            pieces(layered, Tier::Gpu, 2),
            Ok(vec![50..75, 125..150, 200..225, 275..300])
        );
        assert_eq!(
            pieces(layered, Tier::Host, 1),
            Ok(vec![25..50, 75..100, 125..150, 175..200])
        );
        assert!(shape.with_layers(3).validate().is_err());
        assert!(shape.with_layers(0).validate().is_err());
        let unvalidated = PoolShape::new(usize::MAX / 2, 3, 0);
        assert!(matches!(
            pieces(unvalidated, Tier::Gpu, 2),
            Err(MemError::InvalidShape { .. })
        ));
        assert_eq!(unvalidated.tier_bytes(Tier::Gpu), usize::MAX);
    }

    #[test]
    fn checker_refuses_and_stays_clear() {
        let shape = PoolShape::new(8, 130, 70);
        let mut checker = MoveChecker::new(&shape);
        let dup = moves(&[(0, 69), (1, 3), (2, 69)]);
        assert_eq!(
            checker.check(&shape, Direction::Offload, &dup),
            Err(MemError::DuplicateTarget {
                tier: Tier::Host,
                page: 69
            })
        );
        let out = moves(&[(0, 1), (130, 2)]);
        assert_eq!(
            checker.check(&shape, Direction::Offload, &out),
            Err(MemError::PageOutOfRange {
                tier: Tier::Gpu,
                page: 130,
                pages: 130
            })
        );
        let out = moves_from(Tier::Host, &[(69, 129), (70, 0)]);
        assert_eq!(
            checker.check(&shape, Direction::Reload, &out),
            Err(MemError::PageOutOfRange {
                tier: Tier::Host,
                page: 70,
                pages: 70
            })
        );
        let wrong = [moves(&[(0, 1)]), moves_from(Tier::Host, &[(3, 4)])].concat();
        assert_eq!(
            checker.check(&shape, Direction::Offload, &wrong),
            Err(MemError::WrongSourceTier {
                expected: Tier::Gpu,
                found: Tier::Host,
                page: 3
            })
        );
        assert_eq!(
            checker.check(&shape, Direction::Reload, &moves(&[(0, 1)])),
            Err(MemError::WrongSourceTier {
                expected: Tier::Host,
                found: Tier::Gpu,
                page: 0
            })
        );
        // Every earlier failure left the bitmap clear, so these targets are not "duplicates".
        assert!(checker.seen.iter().all(|&word| word == 0));
        let ok = moves(&[(0, 69), (1, 3), (2, 0)]);
        assert_eq!(checker.check(&shape, Direction::Offload, &ok), Ok(()));
        assert!(checker.seen.iter().all(|&word| word == 0));
    }

    #[test]
    fn block_table_rows() {
        let shape = BlockTableShape::new(2, 4);
        assert_eq!(shape.check_row(10, 1, &[9, 0]), Ok(()));
        assert_eq!(
            shape.check_row(10, 2, &[]),
            Err(MemError::RowOutOfRange { row: 2, rows: 2 })
        );
        assert_eq!(
            shape.check_row(10, 0, &[1; 5]),
            Err(MemError::RowTooLong { len: 5, width: 4 })
        );
        assert_eq!(
            shape.check_row(10, 0, &[1, 10]),
            Err(MemError::PageOutOfRange {
                tier: Tier::Gpu,
                page: 10,
                pages: 10
            })
        );
        let mut row = [7; 4];
        encode_row(&mut row, &[3, 1]);
        assert_eq!(row, [3, 1, BLOCK_TABLE_PAD, BLOCK_TABLE_PAD]);
        assert_eq!(shape.check_row(10, 0, &[NO_PAGE, 9]), Ok(()));
        encode_row(&mut row, &[NO_PAGE, 1]);
        assert_eq!(row, [BLOCK_TABLE_PAD, 1, BLOCK_TABLE_PAD, BLOCK_TABLE_PAD]);
        assert_eq!(shape.row_range(1), 4..8);
        assert_eq!(shape.prefix(2), Ok(8));
        assert_eq!(
            shape.prefix(3),
            Err(MemError::RowOutOfRange { row: 3, rows: 2 })
        );
    }

    #[test]
    fn errors_display() {
        let error = MemError::PageOutOfRange {
            tier: Tier::Host,
            page: 7,
            pages: 4,
        };
        assert_eq!(error.to_string(), "host page 7 out of range (4 pages)");
        assert_eq!(
            MemError::NoDriver.to_string(),
            "no CUDA driver: libcuda could not be loaded"
        );
        let error = MemError::WrongSourceTier {
            expected: Tier::Gpu,
            found: Tier::Host,
            page: 3,
        };
        assert_eq!(
            error.to_string(),
            "move of host page 3 given to a copy from the GPU tier"
        );
        let error: &dyn std::error::Error = &MemError::NoDriver;
        assert!(error.source().is_none());
    }
}
