//! Typed errors. Every fallible operation returns one of these and changes nothing when it does.

use core::fmt;

use crate::ids::{RequestId, TaskId};

/// Why an adapter (PEFT) operation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PeftError {
    /// The task is not registered with the adapter cache.
    UnknownTask(TaskId),
    /// The adapter needs more pages than the whole device cache has.
    AdapterTooLarge {
        /// The task.
        task: TaskId,
        /// Pages the adapter needs.
        pages: u32,
        /// Pages the cache has.
        capacity: u32,
    },
    /// The host cache cannot hold the adapter even after evicting every evictable task.
    HostCacheFull(TaskId),
    /// Device pages cannot be claimed for the batch: not enough pages can be freed by evicting done tasks.
    DeviceCacheFull {
        /// The task that could not be loaded.
        task: TaskId,
        /// Pages it needs.
        needed: u32,
        /// Pages free plus pages of evictable tasks.
        obtainable: u32,
    },
    /// Unified paging: the KV pool cannot place the adapter, even after evicting every idle cached
    /// block and idle adapter.
    KvPagesFull {
        /// The task.
        task: TaskId,
        /// Pages it needs.
        needed: u32,
    },
    /// The task table is full.
    TaskTableFull,
    /// The task is already registered.
    DuplicateTask(TaskId),
    /// A request holds or is paused on the task (its weights cannot be replaced now).
    TaskBusy(TaskId),
}

impl fmt::Display for PeftError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::UnknownTask(t) => write!(f, "LoRA task {} is not registered with the adapter cache", t.0),
            Self::AdapterTooLarge { task, pages, capacity } => write!(
                f,
                "adapter of task {} needs {pages} pages but the device cache has {capacity}: give the adapter cache more pages",
                task.0
            ),
            Self::HostCacheFull(t) => write!(f, "PEFT host cache is full: could not store task {}", t.0),
            Self::KvPagesFull { task, needed } => write!(
                f,
                "unified paging: the KV pool cannot place the {needed} pages of task {}'s adapter beside the pages in use",
                task.0
            ),
            Self::DeviceCacheFull { task, needed, obtainable } => write!(
                f,
                "PEFT device cache is full: task {} needs {needed} pages, only {obtainable} can be freed by evicting done tasks",
                task.0
            ),
            Self::TaskTableFull => f.write_str("adapter task table is full"),
            Self::DuplicateTask(t) => write!(f, "LoRA task {} is already registered", t.0),
            Self::TaskBusy(t) => write!(
                f,
                "LoRA task {} is in use by a request: its weights can be replaced once none holds or is paused on it",
                t.0
            ),
        }
    }
}

impl core::error::Error for PeftError {}

/// Errors of the scheduler's public entry points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A fixed-capacity table is full (requests, output, storage).
    CapacityExhausted {
        /// Which table.
        what: &'static str,
        /// Its capacity.
        capacity: u32,
    },
    /// The request can never fit: it needs more KV tokens than one request can hold (its page-table
    /// limit, `KvPoolConfig::max_blocks` pages, or the whole pool, whichever is smaller).
    RequestTooLarge {
        /// The request.
        id: RequestId,
        /// Tokens it needs (prompt + reserved output).
        tokens: u64,
        /// Tokens the pool can give one request.
        limit: u64,
    },
    /// A request with this id is already known.
    DuplicateId(RequestId),
    /// The handle does not name a live request (never issued, or its request was removed).
    StaleHandle,
    /// Invalid argument (zero capacity, inconsistent request fields, …).
    Invalid(&'static str),
    /// An adapter-cache error.
    Peft(PeftError),
    /// A lifecycle transition needs the request's KV active on the GPU, and it is not.
    NotOnGpu(RequestId),
    /// The output is not the last pass's, or its step was completed already.
    StaleOutput,
    /// No request could be scheduled for `stalled` consecutive passes although work is pending.
    Deadlock {
        /// Consecutive stalled passes.
        stalled: u32,
        /// A KV connector is attached (the backend has [`crate::kv::Transfers`]): the remedy is the
        /// GPU-only one (no host tier beside a connector).
        connector: bool,
    },
    /// An encoder request is up in the encoder window but the KV backend has no cross pool (spec §1.6
    /// step 7). The pass did nothing.
    CrossPoolRequired,
}

impl From<PeftError> for Error {
    fn from(e: PeftError) -> Self {
        Self::Peft(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::CapacityExhausted { what, capacity } => {
                write!(f, "{what} is full (capacity {capacity})")
            }
            Self::RequestTooLarge { id, tokens, limit } => write!(
                f,
                "request {} needs {tokens} KV tokens but one request can hold at most {limit}: \
                 that is its page-table limit (KvPoolConfig::max_blocks pages, max_blocks_per_request in C and Python) \
                 or the KV pool's pages (gpu_pages), less a LoRA adapter's pages under unified paging: \
                 raise the smaller, or shorten the request",
                id.0
            ),
            Self::DuplicateId(id) => write!(f, "request id {} is already in use", id.0),
            Self::StaleHandle => f.write_str("stale or unknown request handle"),
            Self::Invalid(why) => write!(f, "invalid input: {why}"),
            Self::Peft(e) => e.fmt(f),
            Self::NotOnGpu(id) => write!(
                f,
                "request {}: its KV cache is not active on the GPU, so it cannot own it",
                id.0
            ),
            Self::StaleOutput => f.write_str(
                "this output is not the last pass's, or its step was completed already",
            ),
            Self::Deadlock {
                stalled,
                connector: false,
            } => write!(
                f,
                "V2 scheduler deadlock: nothing could be scheduled for {stalled} consecutive passes although requests are pending; \
                 the KV cache cannot make progress: add a host cache tier, lower max_num_tokens or the batch size, or give the KV pool more pages"
            ),
            Self::Deadlock {
                stalled,
                connector: true,
            } => write!(
                f,
                "V2 scheduler deadlock: nothing could be scheduled for {stalled} consecutive passes although requests are pending; \
                 the KV cache cannot make progress. A KV connector is attached, which requires a GPU-only cache \
                 (with a KV connector the cache is GPU-only, so no host tier can help): lower max_num_tokens or the batch size, \
                 or give the KV pool more pages"
            ),
            Self::CrossPoolRequired => f.write_str(
                "an encoder-init request requires a cross_kv_cache_manager, that is, it requires a cross KV pool: build the KV backend with one (KvSet::with_pools)",
            ),
        }
    }
}

impl core::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;

    #[test]
    fn request_too_large_names_its_limit_and_the_settings_that_raise_it() {
        let msg = Error::RequestTooLarge {
            id: RequestId(7),
            tokens: 9000,
            limit: 8192,
        }
        .to_string();
        assert!(msg.contains("request 7 needs 9000 KV tokens"), "{msg}");
        assert!(msg.contains("at most 8192"), "{msg}");
        for setting in [
            "KvPoolConfig::max_blocks",
            "max_blocks_per_request",
            "gpu_pages",
        ] {
            assert!(msg.contains(setting), "{setting}: {msg}");
        }
    }
}
