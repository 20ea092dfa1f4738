//! The pool's KV event log ([`crate::kv_events`]): attached once, over a buffer, before the prefix
//! cache holds a block; the cache logs into it (`prefix.rs`), the engine drains it.

use super::KvPool;
use crate::kv_events::{EventLog, KvEvent};
use crate::storage::Buffers;

impl<B: Buffers> KvPool<'_, B> {
    /// Attaches a KV event log over `buf` ([`crate::kv_events`]): from now on the prefix cache logs
    /// every block it stores and removes, in each tier, until [`KvPool::take_kv_events`] drains them;
    /// a log that fills up becomes one clear. Refused (`Invalid`, nothing changed) without a prefix
    /// cache, with an empty buffer, once the cache holds a block or when a log is attached already.
    pub fn log_kv_events(&mut self, buf: B::Buf<KvEvent>) -> Result<(), crate::Error> {
        let Some(prefix) = self.prefix.as_mut() else {
            return Err(crate::Error::Invalid("KV events need a prefix cache"));
        };
        if buf.is_empty() || prefix.events.is_some() || prefix.stats.committed > 0 {
            return Err(crate::Error::Invalid(
                "a KV event log is attached once, with room, before the cache holds a block",
            ));
        }
        prefix.events = Some(EventLog::new(buf));
        Ok(())
    }

    /// The KV events logged since the last call, in order (empty without a log).
    pub fn take_kv_events(&mut self) -> &[KvEvent] {
        match self.prefix.as_mut().and_then(|p| p.events.as_mut()) {
            Some(log) => log.take(),
            None => &[],
        }
    }

    /// The KV event log's capacity and the times it overflowed (`None` without a log).
    pub fn kv_event_log(&self) -> Option<(usize, u64)> {
        let log = self.prefix.as_ref()?.events.as_ref()?;
        Some((log.capacity(), log.overflows()))
    }
}
