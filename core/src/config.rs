//! Scheduler configuration.

use crate::phase::Phase;

/// How KV capacity is granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CapacityPolicy {
    /// Grant one step at a time; evict, recompute-pause or preempt under pressure (the reference).
    #[default]
    MaxUtilization,
    /// Reserve KV to completion (prompt + `max_new_tokens`) at admission; never evict.
    GuaranteedNoEvict,
}

/// How context chunks are sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChunkPolicy {
    /// Each request in arrival order takes what the budget leaves (rounded down to the unit).
    #[default]
    FirstComeFirstServed,
    /// Chunks end at the request's snapshot points.
    ForceChunk,
    /// Round-robin one unit at a time over all chunked contexts until the budget is used (C++
    /// micro-batch scheduler).
    EqualProgress,
}

/// Chunked prefill settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunking {
    /// Policy.
    pub policy: ChunkPolicy,
    /// Chunk unit in tokens (used exactly as given, not aligned to pages).
    pub unit: u32,
}

/// The schedulable phase window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Window {
    /// `[CONTEXT_INIT, GENERATION_TO_COMPLETE)`.
    #[default]
    Decoder,
    /// `[ENCODER_INIT, GENERATION_TO_COMPLETE)`.
    Encoder,
}

impl Window {
    /// Whether `phase` lies in the window.
    pub const fn contains(self, phase: Phase) -> bool {
        let lo = match self {
            Window::Decoder => Phase::ContextInit as i8,
            Window::Encoder => Phase::EncoderInit as i8,
        };
        let v = phase as i8;
        v >= lo && v < Phase::GenerationToComplete as i8
    }
}

/// Scheduler configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Request limit per pass (scheduler capacity or max batch size).
    pub max_num_requests: u32,
    /// Token budget per pass; `None` = unlimited.
    pub max_num_tokens: Option<u32>,
    /// Longest context chunk; `None` = unlimited.
    pub max_context_length: Option<u32>,
    /// Chunked prefill; `None` = whole prompts.
    pub chunking: Option<Chunking>,
    /// Capacity policy.
    pub policy: CapacityPolicy,
    /// Destructive recompute pause and context-side preemption allowed.
    pub recompute_pause: bool,
    /// Budget checks use the post-reuse remaining length.
    pub prefix_aware: bool,
    /// Schedulable phases.
    pub window: Window,
    /// Consecutive stalled passes before the pass fails with [`crate::Error::Deadlock`].
    pub deadlock_threshold: u32,
    /// The blocked pending-context fast path (spec §1.11; upstream's kill switch
    /// `TLLM_SCHEDULER_DISABLE_BLOCKED_CTX_SKIP=1` is `false` here). Decision-neutral: it only saves the
    /// probes and calls of an admission that an unpaired draft pool would certainly refuse.
    pub blocked_fast_path: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_num_requests: 100,
            max_num_tokens: Some(1024),
            max_context_length: Some(1024),
            chunking: None,
            policy: CapacityPolicy::MaxUtilization,
            recompute_pause: true,
            prefix_aware: true,
            window: Window::Decoder,
            deadlock_threshold: 1000,
            blocked_fast_path: true,
        }
    }
}

impl Config {
    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), crate::Error> {
        if let Some(c) = self.chunking {
            if c.unit == 0 {
                return Err(crate::Error::Invalid("chunk unit must be at least 1 token"));
            }
        }
        if self.deadlock_threshold == 0 {
            return Err(crate::Error::Invalid(
                "deadlock threshold must be at least 1 pass",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows() {
        assert!(Window::Decoder.contains(Phase::ContextInit));
        assert!(Window::Decoder.contains(Phase::GenerationInProgress));
        assert!(!Window::Decoder.contains(Phase::GenerationToComplete));
        assert!(!Window::Decoder.contains(Phase::EncoderInit));
        assert!(Window::Encoder.contains(Phase::EncoderInit));
        assert!(!Window::Encoder.contains(Phase::Unknown));
    }
}
