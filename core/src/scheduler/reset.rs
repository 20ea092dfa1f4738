//! Resetting the prefix cache (vLLM's `reset_prefix_cache`, beyond the reference): every cached
//! block no request holds is dropped, in every pool, and the next pass is a full one.

use crate::adapter::PeftBackend;
use crate::kv::{KvBackend, KvCaps, PrefixReuse};
use crate::storage::Storage;

use super::Scheduler;

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Scheduler<K, P, N, T, S>
{
    /// Drops every idle cached block ([`PrefixReuse::drop_idle_blocks`]); the blocks live requests
    /// hold stay, and so does every request. Returns the blocks dropped (0 without a prefix cache).
    pub fn reset_prefix_cache(&mut self) -> u32 {
        self.changed();
        self.kv.prefix().map_or(0, PrefixReuse::drop_idle_blocks)
    }
}
