//! Binds the scheduler's decisions to memory: the KV page moves and block tables ([`KvPages`])
//! and the adapter cache's plan ([`AdapterSlots`]).
//!
//! kvsched-core decides, in every pass, which KV pages move between tiers (handed over by
//! [`Scheduler::take_moves`](kvsched_core::Scheduler::take_moves)), which requests run (the
//! [`SchedulerOutput`](kvsched_core::SchedulerOutput) lists, whose KV pages are the rows of
//! [`KvPool::table`](kvsched_core::page_pool::KvPool::table)) and which adapters are copied to or
//! dropped from the device
//! ([`SchedulerOutput::adapter_loads`](kvsched_core::SchedulerOutput::adapter_loads) and
//! [`Scheduler::take_adapter_evictions`](kvsched_core::Scheduler::take_adapter_evictions)), and
//! which adapters' host copies are written or freed
//! ([`Scheduler::take_adapter_host_changes`](kvsched_core::Scheduler::take_adapter_host_changes)). This
//! module turns those decisions into calls on a [`KvMemory`](crate::KvMemory) and an
//! [`AdapterMemory`](crate::AdapterMemory) store, on either backend. The scheduler owns its
//! backends: the bindings read them through `sched.kv()` and `sched.adapters().backend()`, and the
//! logs they consume are drained through the scheduler.
//!
//! One serving iteration:
//!
//! ```text
//! sched.schedule(&mut out)?;                        // the pass
//! sched.ensure_batch(&mut out)?;                    // the adapter plan (loads, evictions)
//! // Suspend / resume copies (taking the moves also settles the requests the pass resumed).
//! let moved = kv.apply_moves(sched.take_moves(), &mut kv_store)?;
//! // Adapter host copies: free the evicted ones, write the loaded ones from the engine's source.
//! host_changes.clear();
//! sched.take_adapter_host_changes(|task, change| host_changes.push((task, change)));
//! adapters.apply_host_changes(&mut adapter_store, &host_changes, &mut read_weights)?;
//! // Adapter uploads: the device evictions (a Vec<TaskRef> kept across iterations), then the plan.
//! evicted.clear();
//! sched.take_adapter_evictions(|task| evicted.push(task));
//! let peft = sched.adapters().backend();
//! let loaded = adapters.apply_plan(&mut adapter_store, peft, &evicted, &out)?;
//! let tables = kv.stage_tables(sched.kv(), &out, &mut kv_store)?;   // block tables
//! // The step's kernels wait on moved.event, loaded.event and tables.event, then run the batch:
//! // rows of the block table in `block_table_rows(&out)` order; adapter weights at
//! // `adapters.device_pages(task_slot)` (CudaAdapterStore::page_address for their addresses).
//! sched.complete_step(&out)?;
//! ```
//!
//! Neither binding allocates in steady state: their buffers grow to the pools' sizes once.

mod adapter;
mod kv;

pub use adapter::{AdapterSlotStats, AdapterSlots, AdapterUploads, WeightSource};
pub use kv::{block_table_rows, AppliedMoves, KvPageStats, KvPages, StagedTables};
