//! Binds kvsched-core's KV page and adapter arenas to memory: CUDA device memory through cudarc's
//! driver API, or plain host memory (`Vec<u8>`) for CI and the simulator.
//!
//! The scheduler core decides *which* pages move; this crate is the mechanism that moves the bytes.
//! It does not allocate pages (the core's pools do); it maps page ids to addresses and copies.
//!
//! # Page math
//!
//! Every tier is one allocation of `pages * page_bytes` bytes. Page `p` of a tier lives at
//! `base + p * page_bytes` ([`PageStore::page_offset`], [`CudaKvStore::page_address`]).
//!
//! ```text
//!   GPU tier (one device allocation)        host tier (one pinned allocation, not write-combined)
//!   ┌──────┬──────┬──────┬──────┐  offload  ┌──────┬──────┬──────┐
//!   │  p0  │  p1  │  p2  │  p3  │ ────────▶ │  h0  │  h1  │  h2  │
//!   └──────┴──────┴──────┴──────┘ ◀──────── └──────┴──────┴──────┘
//!                                   reload
//! ```
//!
//! Moves are lists of kvsched-core's [`PageMove`] (re-exported here): page `src` of tier `from`
//! goes to page `dst` of the other tier ([`Tier::other`]). The core's KV pool logs them; the
//! stores take the same type, so a move log goes to a store unconverted. Consecutive moves whose
//! `src` and `dst` both advance by one page are merged into one copy ([`page_runs`]).
//!
//! # Tiers
//!
//! The tiers are kvsched-core's [`Tier`] (re-exported here). For the KV store, [`Tier::Gpu`] is
//! the page pool attention kernels read and [`Tier::Host`] the suspend tier. For the adapter store,
//! [`Tier::Gpu`] holds the device adapter pages and [`Tier::Host`] the host adapter pages. The CUDA
//! backend keeps the GPU tier in device memory and the host tier in pinned, not write-combined,
//! host memory; the host backend keeps both in `Vec<u8>`.
//!
//! # Backends
//!
//! | trait            | CUDA                 | host                 |
//! |------------------|----------------------|----------------------|
//! | [`KvMemory`]     | [`CudaKvStore`]      | [`HostKvStore`]      |
//! | [`AdapterMemory`]| [`CudaAdapterStore`] | [`HostAdapterStore`] |
//!
//! Both implement the same traits, so tests run the same code on both. The CUDA backend needs a
//! driver: [`open_device`] returns [`MemError::NoDriver`] instead of panicking when there is none.
//!
//! # Binding the scheduler
//!
//! [`bind`] follows the scheduler's decisions on any store: [`KvPages`] applies the scheduler's
//! move log ([`Scheduler::take_moves`](kvsched_core::Scheduler::take_moves): batched offloads and
//! reloads, in a safe order) and uploads the block tables of a scheduled batch; [`AdapterSlots`]
//! keeps LoRA weights in host pages and uploads them into device pages when the adapter plan loads
//! them (evictions only free pages).
#![deny(missing_docs)]

pub mod bind;
mod copy;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod cuda_copy;
mod error;
mod host;
mod page;

pub use bind::{AdapterSlots, KvPages};
pub use copy::{copy_pieces, CopyMethod, CopyPiece, CopyPlan};
#[cfg(feature = "cuda")]
pub use cuda::{driver_present, open_device, CudaAdapterStore, CudaKvStore};
pub use error::MemError;
pub use host::{HostAdapterStore, HostKvStore};
pub use page::{
    page_runs, AdapterMemory, AdapterShape, BlockTableShape, CopyEvent, KvMemory, KvShape, PageRun,
    PageRuns, PageStore, PoolShape, BLOCK_TABLE_PAD,
};

/// kvsched-core's page-move vocabulary, which the stores take as is: a [`PageMove`] copies page
/// `src` of tier `from` to page `dst` of the other [`Tier`].
pub use kvsched_core::kv::{PageMove, Tier};

/// The cudarc driver types this crate's API exposes (contexts, streams, events, device slices).
#[cfg(feature = "cuda")]
pub use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DriverError};
