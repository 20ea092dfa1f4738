//! Typed errors. The tiers they name are kvsched-core's [`Tier`] (see the crate docs).

use core::fmt;

#[cfg(feature = "cuda")]
use cudarc::driver::DriverError;
use kvsched_core::kv::Tier;

/// Everything that can go wrong in this crate. Bad input is refused before any copy is issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemError {
    /// No CUDA driver library (`libcuda`) could be loaded on this machine.
    NoDriver,
    /// A shape that cannot be allocated (zero page size, byte size overflow, page ids beyond `i32`).
    InvalidShape {
        /// Which rule the shape broke.
        reason: &'static str,
    },
    /// A page id at or beyond the number of pages in its tier.
    PageOutOfRange {
        /// The tier the page id refers to.
        tier: Tier,
        /// The offending page id.
        page: u32,
        /// The number of pages in that tier.
        pages: u32,
    },
    /// A move whose source tier ([`PageMove::from`](kvsched_core::PageMove::from)) is not the tier
    /// the call copies from: `offload` takes GPU → host moves, `reload` and `upload_adapter` host →
    /// GPU moves.
    WrongSourceTier {
        /// The tier the call copies from.
        expected: Tier,
        /// The move's source tier.
        found: Tier,
        /// The move's source page.
        page: u32,
    },
    /// The same target page appears twice in one move list (the result would depend on copy order).
    DuplicateTarget {
        /// The tier the targets live in.
        tier: Tier,
        /// The repeated target page.
        page: u32,
    },
    /// A buffer whose length differs from what the operation needs.
    LengthMismatch {
        /// The length the operation needs (bytes for pages, entries for block tables).
        expected: usize,
        /// The length it was given.
        actual: usize,
    },
    /// A block-table row index at or beyond the number of rows.
    RowOutOfRange {
        /// The offending row.
        row: u32,
        /// The number of rows.
        rows: u32,
    },
    /// A request's page list longer than a block-table row.
    RowTooLong {
        /// Pages in the list.
        len: usize,
        /// Entries in a row.
        width: u32,
    },
    /// A request the scheduler put in the batch whose KV cache is not active on the GPU tier (a
    /// block-table row can only name GPU pages).
    NotActive {
        /// The request's table slot.
        slot: u16,
    },
    /// Not enough free pages in a tier for what was asked (host pages for an adapter's weights,
    /// device pages for an adapter plan's loads).
    OutOfPages {
        /// The tier.
        tier: Tier,
        /// Pages asked for.
        needed: u32,
        /// Pages free.
        free: u32,
    },
    /// An adapter plan (or a registration) that does not fit what the adapter slots hold: an
    /// unknown task, an eviction of an adapter that is not resident, a load of one that is, a page
    /// count that differs from the core's adapter cache.
    AdapterPlan {
        /// The task's slot in the core's adapter cache.
        slot: kvsched_core::ids::TaskSlot,
        /// Which rule the plan broke.
        reason: &'static str,
    },
    /// The host backend could not allocate a tier (plain heap memory).
    HostAllocation {
        /// The size that was refused.
        bytes: usize,
    },
    /// A CUDA driver call failed.
    #[cfg(feature = "cuda")]
    Driver(DriverError),
}

impl fmt::Display for MemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoDriver => f.write_str("no CUDA driver: libcuda could not be loaded"),
            Self::InvalidShape { reason } => write!(f, "invalid shape: {reason}"),
            Self::PageOutOfRange { tier, page, pages } => {
                write!(f, "{tier} page {page} out of range ({pages} pages)")
            }
            Self::WrongSourceTier {
                expected,
                found,
                page,
            } => write!(
                f,
                "move of {found} page {page} given to a copy from the {expected} tier"
            ),
            Self::DuplicateTarget { tier, page } => {
                write!(f, "{tier} page {page} is the target of more than one move")
            }
            Self::LengthMismatch { expected, actual } => {
                write!(f, "length mismatch: expected {expected}, got {actual}")
            }
            Self::RowOutOfRange { row, rows } => {
                write!(f, "block-table row {row} out of range ({rows} rows)")
            }
            Self::RowTooLong { len, width } => {
                write!(f, "{len} pages do not fit a block-table row of {width}")
            }
            Self::NotActive { slot } => write!(
                f,
                "request slot {slot} is in the batch but its KV cache is not active on the GPU"
            ),
            Self::OutOfPages { tier, needed, free } => {
                write!(f, "{needed} {tier} pages needed, {free} free")
            }
            Self::AdapterPlan { slot, reason } => {
                write!(f, "adapter plan for task slot {slot}: {reason}")
            }
            Self::HostAllocation { bytes } => write!(f, "host allocation of {bytes} bytes failed"),
            #[cfg(feature = "cuda")]
            Self::Driver(error) => write!(f, "CUDA driver error: {error}"),
        }
    }
}

impl std::error::Error for MemError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            #[cfg(feature = "cuda")]
            Self::Driver(error) => Some(error),
            _ => None,
        }
    }
}

#[cfg(feature = "cuda")]
impl From<DriverError> for MemError {
    fn from(error: DriverError) -> Self {
        Self::Driver(error)
    }
}
