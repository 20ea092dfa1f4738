//! How a batch of page moves becomes copies: the methods a store can submit them with, the choice
//! between them at run time, and the pieces each method copies.
//!
//! Measured on an H200 (`data/measurements/h200/page-copy-methods.md`, PCIe Gen5 x16, 256 MiB of
//! shuffled pages per move): one driver copy per page reaches 3 % of one contiguous copy at 4 KiB
//! pages and 33 % at 64 KiB; one batched driver copy (`cuMemcpyBatchAsync`) 11-17 % at 4 KiB, 72 % at
//! 64 KiB, 90-92 % at 256 KiB and 98-99 % at 2 MiB; a gather/scatter kernel over mapped pinned host
//! memory 92-95 % at every size, on 2 of the 132 multiprocessors (blocks of 1024 threads). Kernel
//! copies compete with the forward pass for multiprocessors and memory bandwidth; copy-engine copies
//! do not. Hence the default, [`CopyMethod::AUTO`]: the kernel below 256 KiB pages (where the copy
//! engines stay under 90 %), the copy engines from 256 KiB up, the kernel on 2 blocks.
//!
//! Every method copies the same bytes: the runs of [`page_runs`] (consecutive moves merged), cut into
//! [`CopyPiece`]s of at most [`CopyPlan::max_piece`] bytes for the kernel so that its warps share a
//! long run. Moves within one call never overlap (the stores refuse duplicate targets); calls are
//! ordered on the store's one copy stream, so a page a move frees is reused only after the copy that
//! reads it, whatever method either call used.

use kvsched_core::kv::{PageMove, Tier};

use crate::page::{page_runs, PoolShape};

/// How a store submits a batch of page moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyMethod {
    /// One driver copy per run of consecutive pages (`cuMemcpyAsync`).
    PerRun,
    /// One driver call for the batch (`cuMemcpyBatchAsync`, CUDA 12.8 and later): the copy engines.
    Batched,
    /// One launch of the gather/scatter kernel on `blocks` blocks of 1024 threads, reading or writing
    /// the pinned host tier through its device mapping.
    Kernel {
        /// Thread blocks (1 to [`CopyMethod::MAX_BLOCKS`]).
        blocks: u32,
    },
    /// The kernel for pages (in a layer-major pool: per-layer pieces) smaller than `kernel_below`
    /// bytes, the batched copy otherwise.
    Auto {
        /// Page (piece) size from which the copy engines take over.
        kernel_below: usize,
        /// Thread blocks of the kernel.
        blocks: u32,
    },
}

impl CopyMethod {
    /// The default: the kernel on 2 blocks below 256 KiB pages, the batched copy from there up.
    pub const AUTO: Self = Self::Auto {
        kernel_below: 256 << 10,
        blocks: 2,
    };

    /// The most thread blocks a kernel copy may take.
    pub const MAX_BLOCKS: u32 = 132;

    /// What a store whose copies are pieces of `page_bytes` bytes (its pages, or one layer of a page in
    /// a layer-major pool) runs: `batched` says whether the driver has the batched copy, `kernel`
    /// whether the kernel can run (loaded, pieces a multiple of 16 bytes). A method the store cannot
    /// run falls back: kernel → batched → one copy per run.
    pub fn plan(self, page_bytes: usize, batched: bool, kernel: bool) -> CopyPlan {
        let wanted = match self {
            Self::Auto {
                kernel_below,
                blocks,
            } if page_bytes < kernel_below => CopyPlan::Kernel { blocks },
            Self::Auto { .. } | Self::Batched => CopyPlan::Batched,
            Self::Kernel { blocks } => CopyPlan::Kernel { blocks },
            Self::PerRun => CopyPlan::PerRun,
        };
        match wanted {
            CopyPlan::Kernel { blocks } if kernel => CopyPlan::Kernel {
                blocks: blocks.clamp(1, Self::MAX_BLOCKS),
            },
            CopyPlan::Kernel { .. } | CopyPlan::Batched if batched => CopyPlan::Batched,
            _ => CopyPlan::PerRun,
        }
    }
}

impl Default for CopyMethod {
    fn default() -> Self {
        Self::AUTO
    }
}

/// What one call runs (a [`CopyMethod`] resolved for a store).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyPlan {
    /// One driver copy per run.
    PerRun,
    /// One batched driver call.
    Batched,
    /// One kernel launch on `blocks` blocks.
    Kernel {
        /// Thread blocks.
        blocks: u32,
    },
}

impl CopyPlan {
    /// The longest piece the plan copies: a kernel warp copies one piece at a time, so long runs are
    /// cut into 64 KiB pieces to spread them over the warps; the driver takes whole runs.
    pub const fn max_piece(self) -> usize {
        match self {
            Self::Kernel { .. } => 64 << 10,
            Self::PerRun | Self::Batched => usize::MAX,
        }
    }
}

/// One contiguous copy: byte offsets into the source and target tiers, and a length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyPiece {
    /// Offset in the source tier.
    pub source: usize,
    /// Offset in the target tier.
    pub target: usize,
    /// Bytes.
    pub len: usize,
}

/// The pieces of a move list from tier `from` of `shape`, in list order: each run of consecutive
/// moves ([`page_runs`]) as one piece per layer (one for contiguous pages; a layer-major run is one
/// piece in each layer's region, see [`PoolShape`]), cut into pieces of at most `max_piece` bytes.
/// A piece is never empty.
pub fn copy_pieces(
    moves: &[PageMove],
    shape: PoolShape,
    from: Tier,
    max_piece: usize,
) -> impl Iterator<Item = CopyPiece> + '_ {
    let max_piece = max_piece.max(1);
    let piece = shape.piece_bytes();
    let stride = |tier| shape.pages(tier) as usize * piece;
    let (source_stride, target_stride) = (stride(from), stride(from.other()));
    page_runs(moves).flat_map(move |run| {
        let len = run.pages as usize * piece;
        (0..shape.layers.max(1) as usize).flat_map(move |layer| {
            let source = layer * source_stride + run.source as usize * piece;
            let target = layer * target_stride + run.target as usize * piece;
            (0..len.div_ceil(max_piece)).map(move |k| {
                let at = k * max_piece;
                CopyPiece {
                    source: source + at,
                    target: target + at,
                    len: max_piece.min(len - at),
                }
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mv(src: u32, dst: u32) -> PageMove {
        PageMove {
            request: kvsched_core::ids::RequestId::default(),
            from: Tier::Gpu,
            src,
            dst,
        }
    }

    #[test]
    fn auto_takes_the_kernel_for_small_pages_and_the_copy_engines_for_large_ones() {
        let auto = CopyMethod::AUTO;
        assert_eq!(
            auto.plan(4 << 10, true, true),
            CopyPlan::Kernel { blocks: 2 }
        );
        assert_eq!(
            auto.plan((256 << 10) - 16, true, true),
            CopyPlan::Kernel { blocks: 2 }
        );
        assert_eq!(auto.plan(256 << 10, true, true), CopyPlan::Batched);
        assert_eq!(auto.plan(2 << 20, true, true), CopyPlan::Batched);
        let custom = CopyMethod::Auto {
            kernel_below: 1 << 20,
            blocks: 4,
        };
        assert_eq!(
            custom.plan(512 << 10, true, true),
            CopyPlan::Kernel { blocks: 4 }
        );
    }

    #[test]
    fn a_method_the_store_cannot_run_falls_back() {
        let auto = CopyMethod::AUTO;
        assert_eq!(auto.plan(4 << 10, true, false), CopyPlan::Batched);
        assert_eq!(auto.plan(4 << 10, false, false), CopyPlan::PerRun);
        assert_eq!(auto.plan(2 << 20, false, true), CopyPlan::PerRun);
        assert_eq!(
            CopyMethod::Kernel { blocks: 0 }.plan(4096, false, true),
            CopyPlan::Kernel { blocks: 1 }
        );
        assert_eq!(
            CopyMethod::Kernel { blocks: 999 }.plan(4096, false, true),
            CopyPlan::Kernel {
                blocks: CopyMethod::MAX_BLOCKS
            }
        );
        assert_eq!(
            CopyMethod::Batched.plan(4096, false, true),
            CopyPlan::PerRun
        );
        assert_eq!(CopyMethod::PerRun.plan(4096, true, true), CopyPlan::PerRun);
    }

    #[test]
    fn pieces_follow_the_runs_and_cut_long_ones() {
        // Pages 0,1,2 → 10,11,12 form one run; 7 → 3 is a run of its own.
        let moves = [mv(0, 10), mv(1, 11), mv(2, 12), mv(7, 3)];
        let whole: Vec<CopyPiece> =
            copy_pieces(&moves, PoolShape::new(100, 16, 16), Tier::Gpu, usize::MAX).collect();
        assert_eq!(
            whole,
            [
                CopyPiece {
                    source: 0,
                    target: 1000,
                    len: 300
                },
                CopyPiece {
                    source: 700,
                    target: 300,
                    len: 100
                }
            ]
        );
        let cut: Vec<CopyPiece> =
            copy_pieces(&moves, PoolShape::new(100, 16, 16), Tier::Gpu, 128).collect();
        assert_eq!(
            cut.iter()
                .map(|p| (p.source, p.target, p.len))
                .collect::<Vec<_>>(),
            [
                (0, 1000, 128),
                (128, 1128, 128),
                (256, 1256, 44),
                (700, 300, 100)
            ]
        );
        // Every byte of every move is covered exactly once.
        let total: usize = cut.iter().map(|p| p.len).sum();
        assert_eq!(total, moves.len() * 100);
        assert_eq!(
            copy_pieces(&[], PoolShape::new(100, 16, 16), Tier::Gpu, 64).count(),
            0
        );
    }

    #[test]
    fn a_layer_major_run_is_one_piece_per_layer() {
        // 2 layers of 50 bytes; GPU regions are 10 pages long (500 bytes), host regions 4 (200).
        let shape = PoolShape::new(100, 10, 4).with_layers(2);
        let moves = [mv(3, 1), mv(4, 2)];
        let got: Vec<(usize, usize, usize)> = copy_pieces(&moves, shape, Tier::Gpu, usize::MAX)
            .map(|p| (p.source, p.target, p.len))
            .collect();
        assert_eq!(got, [(150, 50, 100), (650, 250, 100)]);
    }

    proptest::proptest! {
        /// Copying the pieces of a move list, cut at any size, in any layout, writes exactly what
        /// copying each move's page, layer by layer, would.
        #[test]
        fn pieces_copy_exactly_the_moved_pages(
            pairs in proptest::collection::vec((0u32..64, 0u32..48), 0..40),
            piece_bytes in 1usize..20,
            layers in 1u32..4,
            max_piece in 1usize..200,
        ) {
            let shape = PoolShape::new(piece_bytes * layers as usize, 64, 48).with_layers(layers);
            // Distinct targets, as the stores require.
            let mut seen = std::collections::HashSet::new();
            let moves: Vec<PageMove> = pairs
                .into_iter()
                .filter(|&(_, d)| seen.insert(d))
                .map(|(s, d)| mv(s, d))
                .collect();
            let source: Vec<u8> = (0..shape.tier_bytes(Tier::Gpu)).map(|i| (i % 251) as u8).collect();
            let target_len = shape.tier_bytes(Tier::Host);
            let (mut by_piece, mut by_page) = (vec![0u8; target_len], vec![0u8; target_len]);
            for p in copy_pieces(&moves, shape, Tier::Gpu, max_piece) {
                proptest::prop_assert!(p.len >= 1 && p.len <= max_piece);
                by_piece[p.target..p.target + p.len].copy_from_slice(&source[p.source..p.source + p.len]);
            }
            for m in &moves {
                let from = shape.page_pieces(Tier::Gpu, m.src).unwrap();
                let to = shape.page_pieces(Tier::Host, m.dst).unwrap();
                for (s, d) in from.zip(to) {
                    by_page[d].copy_from_slice(&source[s]);
                }
            }
            proptest::prop_assert_eq!(by_piece, by_page);
        }
    }
}
