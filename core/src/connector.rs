//! The KV connector: an external KV store (a cluster-wide cache such as LMCache or Mooncake Store, or
//! a peer's memory reached through NIXL) that can provide a prompt's prefix, as the scheduler sees it.
//!
//! The trait is the scheduler side of the two established connector interfaces: vLLM's
//! `KVConnectorBase_V1` (how many new tokens the store can provide for a request, the state after the
//! request's pages are allocated, the loads that finished) and the reference's connector rules (spec
//! §1.12, §1.15: a request with a pending load is never a victim, and pending loads hold the stall
//! counter). It is attached to the built-in page pool ([`crate::KvPool::attach_connector`]), which is
//! where the reference wires it too:
//!
//! 1. A first chunk's prefix is matched in the pool's own prefix cache first; the connector is then
//!    asked for the blocks after it ([`KvConnector::matched_blocks`], by the prompt's chained block
//!    keys). What it offers counts as reused: the chunk is charged only the rest (spec AA1).
//! 2. When the chunk's pages are allocated, the pool hands the connector the pages to fill
//!    ([`KvConnector::start_load`]). The load runs with the chunk's step (layer by layer, as the
//!    reference's connector loads: the step's attention reads each layer's blocks once they are in),
//!    and stays *unconfirmed* until the connector reports its end ([`KvConnector::take_load_ends`]).
//!    Unconfirmed blocks are not committed to the prefix cache, so a failed load never poisons it; a
//!    confirmed load's blocks are committed then.
//! 3. A load that fails, or that is still unconfirmed after the pool's timeout (vLLM #49829: a load
//!    that never completes must not hold a request forever), is abandoned: the request is
//!    recompute-paused by the next pass and replays its prefill without the connector.
//! 4. A request freed while its load is unconfirmed cancels it ([`KvConnector::cancel_load`]); a late
//!    end reported for a request that no longer loads into that slot is ignored (vLLM #39186).
//! 5. As a request's prompt blocks are committed to the prefix cache, the store may save them
//!    ([`KvConnector::start_save`], one save in flight a request slot). The pages a save reads are
//!    pinned until the store reports its end, even when the request finishes or is preempted first
//!    (vLLM #39186: a request freed before its save was acknowledged); a preempted request re-admitted
//!    meanwhile finds its pinned blocks in the cache (vLLM #46014: no load and save of one block at
//!    once). A save past the timeout is abandoned ([`KvConnector::cancel_save`]).
//!
//! Asynchronous loads that outlive a step (vLLM's `load_kv_async`, TensorRT-LLM's parked loads) are the
//! engine's to order: it parks the request (a transfer-holding state, or in flight) and marks the load
//! pending with [`crate::Scheduler::set_pending_load`], which the reference's rules then protect.
//!
//! An adapter for a real store implements the four methods over its client: a lookup by block key
//! (LMCache's `lookup`, Mooncake Store's `exists`), a read into the engine's pages at the given page
//! ids (a NIXL or CUDA transfer the engine's worker runs), its cancellation, and a completion poll.

use crate::kv::KvRef;

/// How a load ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadEnd {
    /// The pages hold the blocks.
    Done,
    /// The pages hold nothing usable: the request must compute those tokens itself.
    Failed,
}

/// The scheduler side of an external KV store (see the module docs).
pub trait KvConnector {
    /// The blocks after the pool's own match that the store can provide: `first_block` is the index of
    /// the first of them in the prompt (the blocks the pool matched), `chain` the chained key of the
    /// last block the pool matched (the request's prefix root when none), `hashes` the prompt's
    /// remaining block hashes, in order, at most as many as a first chunk may reuse. A block's key is
    /// [`crate::kv::chain`] of its parent's key and its hash, so keys name the adapter and salt
    /// as the pool's own do. Returns the whole blocks the store can provide from the first of them (at
    /// most `hashes.len()` count).
    fn matched_blocks(&mut self, r: KvRef, first_block: u32, chain: u64, hashes: &[u64]) -> u32;
    /// The request's pages for the offered blocks are allocated: write the blocks from `first_block`
    /// (the first offered block's index in the prompt) into `pages`, one block a page, in order.
    fn start_load(&mut self, r: KvRef, pages: &[u32], first_block: u32);
    /// Abandons the request's unconfirmed load (the request was freed, or the load timed out): its
    /// pages are no longer the connector's to write.
    fn cancel_load(&mut self, r: KvRef);
    /// Hands `ended` every load that ended since the last call.
    fn take_load_ends(&mut self, ended: &mut dyn FnMut(KvRef, LoadEnd));
    /// The request's computed prompt blocks from `first_block` are in `pages` (one block a page, in
    /// order, each a committed block of the pool's prefix cache): the store may save them. An accepted
    /// save pins the pages — they are not evicted or reused, even after the request finishes or is
    /// preempted — until the store reports its end ([`KvConnector::take_save_ends`]). The default
    /// declines (a store that only loads).
    fn start_save(&mut self, r: KvRef, pages: &[u32], first_block: u32) -> bool {
        let _ = (r, pages, first_block);
        false
    }
    /// Hands `ended` every save that ended since the last call.
    fn take_save_ends(&mut self, ended: &mut dyn FnMut(KvRef)) {
        let _ = ended;
    }
    /// Abandons the request's save (it outlived the pool's timeout): its pages are no longer the
    /// store's to read.
    fn cancel_save(&mut self, r: KvRef) {
        let _ = r;
    }
}
