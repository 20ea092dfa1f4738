//! # kvsched-core
//!
//! The scheduling core of kvsched: a `#![no_std]`, heap-free, `unsafe`-free crate that decides, every
//! iteration, which LLM requests run (generation first, then chunked prefill) within a token budget, a
//! batch limit and a LoRA adapter page budget, while it owns a paged KV cache (GPU tier + optional host
//! tier) and an adapter cache.
//!
//! The resource lifecycle of a request is a matter of types (see [`request`]): a request is a
//! [`Request<S>`](request::Request) whose type parameter says what it owns. Resuming a suspended request
//! needs the KV backend *and* the adapter desk, and hands back a fresh [`AdapterLease`](lease::AdapterLease)
//! inside [`Resumed`](request::Resumed); a batch accepts only [`Active`](request::Active) and
//! [`Resumed`](request::Resumed) requests. Every capability a transition needs is minted inside this
//! crate, so the public API cannot walk around the lifecycle.
//!
//! Layers (one module per concept; a module uses only its own layer and lower ones, which
//! `core/tests/tidy.rs` checks on every `crate::` path):
//!
//! ```text
//! L4 scheduler   config  budget  step_budget  scheduler/ (the pass, one file per rule)  output  delta
//!                wire
//!                    │ schedules requests through their transitions
//! L3 lifecycle   request/ (the type-state Request<S>)  lease (adapter leases, the desk)
//!                    │ calls backends only through their contracts
//! L2 mechanisms  page_pool/ (KvPool, borrowed or owned)  kv_set (draft/cross pairing)  adapter_pool
//!                kv_groups (full-attention, sliding-window and recurrent-state groups)  state_pool
//!                    │ implement
//! L1 contracts   kv (KvBackend, PageMove, chain; kv/caps.rs: its capabilities)  adapter (PeftBackend)
//!                connector (KvConnector)  kv_events (the prefix cache's events, for KV-aware routers)
//!                    │ name
//! L0 vocabulary  ids  error  phase  arena  id_index  bomb  fmt  fingerprint  storage  narrow
//! ```
//!
//! - [`ids`], [`error`], [`phase`], [`arena`]: request and task ids, the error values, the upstream
//!   request states (`LlmRequestState`), the fixed-capacity generational slot arena; [`storage`]:
//!   where fixed-capacity state lives (a page pool's buffers borrowed or owned, a scheduler's arrays
//!   inline or boxed).
//! - [`kv`]: the KV backend contract (what every pool does, and the capabilities only some have:
//!   [`kv::caps`]) and the page-move vocabulary; [`adapter`]: the PEFT backend contract;
//!   [`connector`]: an external KV store as the scheduler sees it; [`kv_events`]: what the prefix
//!   cache tells a KV-aware router (blocks stored, removed, all cleared).
//! - [`page_pool`]: the fixed-capacity two-tier page pool (optional prefix cache, unified adapter paging,
//!   a KV connector); [`kv_set`]: draft and cross pools beside the target; [`kv_groups`]: a
//!   hybrid-attention model's full-attention and sliding-window groups; [`adapter_pool`]: the
//!   fixed-capacity adapter cache.
//! - [`request`]: the type-state lifecycle; [`lease`]: adapter leases and the desk that mints them.
//! - [`config`], [`budget`], [`step_budget`], [`output`], [`delta`], [`wire`]: pass configuration,
//!   per-pass budgets (tokens, and time: an inter-token-latency target over a cost model), the scheduler
//!   output, the batch delta and the output's plain-old-data wire form; [`scheduler`]: the request table and the pass.
//!
//! A serving loop over buffers on the stack (no heap; with the `alloc` feature, `KvPool::owned` gives a
//! pool that owns its buffers on the heap):
//!
//! ```
//! use kvsched_core::adapter_pool::AdapterPool;
//! use kvsched_core::config::Config;
//! use kvsched_core::kv::PageMove;
//! use kvsched_core::output::SchedulerOutput;
//! use kvsched_core::page_pool::{KvPool, KvPoolConfig, KvStorage, Seq};
//! use kvsched_core::ids::TaskId;
//! use kvsched_core::request::RequestSpec;
//! use kvsched_core::scheduler::Scheduler;
//! use kvsched_core::Phase;
//!
//! // 64 GPU and 64 host pages of 16 tokens; 8 requests of up to 16 pages.
//! let cfg = KvPoolConfig { tokens_per_block: 16, gpu_pages: 64, host_pages: 64, slots: 8, max_blocks: 16 };
//! let (mut gpu, mut host) = ([0u32; 64], [0u32; 64]);
//! let mut tables = [0u32; 8 * 16];
//! let mut seqs = [Seq::default(); 8];
//! let mut moves = [PageMove::default(); 128];
//! assert!(moves.len() >= cfg.move_log_len() && tables.len() == cfg.table_len());
//! let storage = KvStorage {
//!     gpu_free: &mut gpu,
//!     host_free: &mut host,
//!     tables: &mut tables,
//!     seqs: &mut seqs,
//!     moves: &mut moves[..cfg.move_log_len()],
//!     prefix: None,
//! };
//! let pool = KvPool::new(cfg, storage)?;
//! let mut adapters = AdapterPool::<4>::new(4, 16)?;
//! adapters.register(TaskId(7), 2)?;
//! let mut sched: Scheduler<_, _, 8, 4> = Scheduler::new(Config::default(), pool, adapters)?;
//! let mut out = SchedulerOutput::<8>::new();
//!
//! let h = sched.submit(RequestSpec::new(1, Phase::ContextInit, 100).with_lora(7))?;
//! for _ in 0..3 {
//!     sched.schedule(&mut out)?; // the batch: out.context(), out.generation(), …
//!     sched.ensure_batch(&mut out)?; // out.adapter_loads(): adapters to copy in
//!     let _copies = sched.take_moves(); // page copies to run before the step
//!     sched.complete_step(&out)?; // the engine ran the step
//! }
//! assert_eq!(sched.get(h)?.spec().phase, Phase::GenerationInProgress);
//! sched.remove(h)?;
//! # Ok::<(), kvsched_core::Error>(())
//! ```
//!
//! ## Where a scheduler lives
//!
//! A [`Scheduler`] and its [`SchedulerOutput`] are fixed-capacity values: their arrays (the request
//! table, the pass scratch, the fairness counters, the per-slot and per-task arrays, the output lists)
//! grow with `N` (requests) and `T` (adapter task slots). Their last type parameter, a
//! [`Storage`](storage::Storage), says where those arrays are; the default keeps `Scheduler<K, P, N, T>`
//! and `SchedulerOutput<N>` what they always were.
//!
//! | where | built by | storage |
//! |---|---|---|
//! | a `static` | [`Scheduler::new_const`] and [`SchedulerOutput::new`], `const fn`s (the backends must be const-constructible too; an invalid configuration is a compile error) | [`Inline`](storage::Inline), the default |
//! | a `Box`, or any place, without passing through the stack (feature `alloc`) | `Scheduler::boxed` (or [`Scheduler::new_in`]) and [`SchedulerOutput::new_in`]: every array its own heap allocation, filled in place; the value keeps a pointer an array | `storage::Boxed` |
//! | the stack | [`Scheduler::new`] and [`SchedulerOutput::new`]: only for a small `N` (a debug build copies the value several times while it is built) | [`Inline`](storage::Inline) |
//!
//! The hot paths read the inline arrays directly (what the benches measure); a boxed scheduler takes
//! one pointer more per array and behaves identically (`core/tests/storage.rs` runs both). The sizes on
//! 64-bit in a release build, pinned by that test (the boxed value is what is left: the configuration,
//! the counters and the backends; a debug build with `std` adds 8 bytes a request inline, the drop
//! bomb's flag):
//!
//! | instantiation | inline | boxed |
//! |---|---|---|
//! | the C engine's, `Scheduler<KvPool<'_, Owned>, AdapterPool<64>, 1024, 64>` | 429,712 B | 5,072 B (3,864 of them the adapter cache) |
//! | the bench's S1-256, `Scheduler<KvSet<KvPool<'_, Owned>>, AdapterPool<8>, 256, 8>` | 108,632 B | 2,912 B |
//! | the conformance runner's, `Scheduler<KvSet<_, _, _>, _, 1024, 256>` (scripted backends of one pointer) | 431,272 B | 680 B |
//! | the simulator's, `Scheduler<KvSet<KvPool<'_, Owned>>, AdapterPool<1024>, 1024, 1024>` | 517,256 B | 62,856 B (60,504 of them the adapter cache) |
//! | `SchedulerOutput<1024>` | 98,392 B | 160 B |
//!
//! A page pool's buffers are chosen the same way ([`Buffers`](storage::Buffers)): lent by the caller
//! ([`KvStorage`](page_pool::KvStorage): statics, the stack, no heap) or owned by the pool
//! (`KvPool::owned`, feature `alloc`), one type, [`KvPool<'a, B>`](page_pool::KvPool).
//!
//! ## References in the comments
//!
//! "spec §N" in this crate's comments is a section of the behavioural reference (TensorRT-LLM's
//! KV-cache-V2 scheduler, paraphrased), `docs/reference/kv-v2-reference.md` in the repository;
//! "DESIGN.md §N" is a section of `docs/reference/DESIGN.md`.
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
// The hot path's small accessors are forced inline: the instruction gate (docs/BENCH.md) measured it.
#![allow(clippy::inline_always)]
// Every integer width in the core is part of its design: a narrowing or sign-changing cast is
// spelled as a checked conversion (`narrow.rs`) or carries the reason it cannot lose bits. (Unit
// tests build their fixtures from small literals and are exempt.)
#![cfg_attr(
    not(test),
    warn(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_possible_wrap,
        clippy::cast_lossless
    )
)]

#[cfg(feature = "alloc")]
extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

mod bomb;
mod fmt;
mod id_index;
mod narrow;
#[cfg(test)]
mod testing;

pub mod adapter;
pub mod adapter_pool;
pub mod arena;
pub mod budget;
pub mod config;
pub mod connector;
pub mod delta;
pub mod error;
pub mod fingerprint;
pub mod ids;
pub mod kv;
pub mod kv_events;
pub mod kv_groups;
pub mod kv_set;
pub mod lease;
pub mod output;
pub mod page_pool;
pub mod phase;
pub mod request;
pub mod scheduler;
pub mod state_pool;
pub mod step_budget;
pub mod storage;
pub mod wire;

pub use adapter::{NoPeft, PeftBackend};
pub use adapter_pool::AdapterPool;
pub use config::{CapacityPolicy, ChunkPolicy, Chunking, Config, Window};
pub use error::{Error, PeftError};
pub use ids::{RequestId, TaskId};
pub use kv::{KvBackend, KvRef, PageMove, Tier};
pub use output::SchedulerOutput;
pub use page_pool::{KvPool, KvPoolConfig};
pub use phase::Phase;
pub use request::{Ownership, RequestSpec};
pub use scheduler::{Adopt, Handle, PassStats, Scheduler};
pub use step_budget::{StepBudget, StepCost};

/// The README's examples: its Rust block runs as a doctest of this crate (`cargo test -p kvsched-core
/// --doc`); its other blocks are marked with their language, which rustdoc skips.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
