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

/// Priority classes of [`Admission::Deadline`].
pub const PRIORITY_CLASSES: usize = 4;

/// The order in which phase 2 admits the deferred context and encoder requests. Only that order
/// changes: generation runs first under every policy (spec §1.2), and each request is admitted by the
/// same rules. Beyond the reference, except [`Admission::Fcfs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Admission {
    /// Arrival order (the reference).
    #[default]
    Fcfs,
    /// Virtual token counters (Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024):
    /// each client — a tenant, else a LoRA task, else the base model — has a counter of the weighted
    /// service it received (`input_weight` per prompt token a completed step processed,
    /// `output_weight` per token it generated); the client with the smallest counter is admitted
    /// first. A client that becomes active again is lifted to the smallest counter of the active ones,
    /// so idleness earns no credit.
    Vtc {
        /// Weight of a processed prompt token.
        input_weight: u32,
        /// Weight of a generated token.
        output_weight: u32,
    },
    /// Earliest deadline first: a request's deadline is `arrival + ttft[priority]` (the engine's
    /// clock and unit). A deadline is absolute, so a waiting request ages: it is overtaken only by
    /// requests whose deadlines are earlier, which a later arrival's is only within its class offset.
    Deadline {
        /// The time-to-first-token objective of each priority class.
        ttft: [u64; PRIORITY_CLASSES],
    },
    /// Priority that preempts (`scheduler/priority.rs`): by [`crate::RequestSpec::priority`], the lower
    /// value first as vLLM's `priority`, then arrival. A request the pass refuses pages or a batch slot
    /// makes one running request of strictly lower priority yield in the next pass (suspended where a
    /// lower tier takes its pages, else recompute-paused where that is allowed), and no request of lower
    /// priority is admitted or resumed while it waits for room. A request refused its adapter is only
    /// ordered. Under GUARANTEED_NO_EVICT it only orders.
    Priority,
}

impl Admission {
    /// VTC's weights in the paper's setting: an output token costs twice an input token.
    pub const VTC: Self = Self::Vtc {
        input_weight: 1,
        output_weight: 2,
    };

    /// Whether a request blocked on its adapter may drain admissions: under a fair policy, once a
    /// request has waited [`Config::drain_after`] passes for its adapter, no later request in the pass
    /// takes a new lease, so the adapters on the device are released as their requests finish and the
    /// blocked one is loaded (SGLang #15129). FCFS keeps the reference's behaviour; so does priority,
    /// within a priority (a request refused its adapter makes a lower priority's lease holder yield
    /// instead; draining there cost 20 % of the throughput in the simulator, docs/ADMISSION.md).
    pub const fn drains(self) -> bool {
        !matches!(self, Self::Fcfs | Self::Priority)
    }

    /// The policy's name: `fcfs`, `vtc`, `deadline` or `priority`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Fcfs => "fcfs",
            Self::Vtc { .. } => "vtc",
            Self::Deadline { .. } => "deadline",
            Self::Priority => "priority",
        }
    }
}

/// Service classes of [`Config::shares`] ([`crate::RequestSpec::class`] is below it).
pub const SERVICE_CLASSES: usize = 4;

/// What a service class is promised ([`Config::shares`], `scheduler/classes.rs`): while one of its
/// requests waits and the class uses less than its share of a resource, the classes above theirs
/// lend it back. Unused, a share is lent: nothing is set aside while the class has nothing waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Share {
    /// Batch slots: the class's requests on the GPU.
    pub requests: u32,
    /// KV tokens: the prompt tokens the class's requests on the GPU have computed (a shared prefix
    /// counts for each; their outputs are not seen by the scheduler).
    pub kv_tokens: u32,
    /// Adapter pages: the device pages of the distinct adapters of the class's requests on the GPU.
    pub adapter_pages: u32,
}

impl core::str::FromStr for Share {
    type Err = &'static str;

    /// `requests=N,kv_tokens=N,adapter_pages=N`, each optional (absent: 0), as the command lines
    /// write a share.
    fn from_str(v: &str) -> Result<Self, Self::Err> {
        let mut share = Share::default();
        for part in v.split(',').filter(|p| !p.is_empty()) {
            let (k, n) = part
                .split_once('=')
                .ok_or("expected requests=N,kv_tokens=N,adapter_pages=N")?;
            let n: u32 = n.parse().map_err(|_| "a share's amount is not a number")?;
            match k {
                "requests" => share.requests = n,
                "kv_tokens" => share.kv_tokens = n,
                "adapter_pages" => share.adapter_pages = n,
                _ => return Err("a share names requests, kv_tokens or adapter_pages"),
            }
        }
        Ok(share)
    }
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

/// Gives a settings enum its names, as the scenario format and the command line spell them: `ALL`,
/// `name` and `from_name`.
macro_rules! names {
    ($ty:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every variant, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The variant's name.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $name),+
                }
            }

            /// The variant called `name`.
            pub fn from_name(name: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|v| v.name() == name)
            }
        }
    };
}

names!(CapacityPolicy { MaxUtilization => "max_utilization", GuaranteedNoEvict => "guaranteed_no_evict" });
names!(ChunkPolicy { FirstComeFirstServed => "fcfs", ForceChunk => "force_chunk", EqualProgress => "equal_progress" });
names!(Window { Decoder => "decoder", Encoder => "encoder" });

/// Scheduler configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Request limit per pass (scheduler capacity or max batch size).
    pub max_num_requests: u32,
    /// Token budget per pass; `None` = unlimited.
    pub max_num_tokens: Option<u32>,
    /// Longest context chunk; `None` = unlimited. Without chunking a chunk is a whole prompt, so
    /// there it may not be below `max_num_tokens` ([`Config::validate`]); an encoder request (never
    /// chunked) whose encoder output is longer is refused at submission (deliberate difference 16).
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
    /// The order of phase 2's admissions (beyond the reference; [`Admission::Fcfs`] is the reference).
    pub admission: Admission,
    /// Under a fair admission policy: consecutive passes a request may be refused its adapter before
    /// admissions drain for it ([`Admission::drains`]); 0 never drains.
    pub drain_after: u32,
    /// A step budget in time: chunks sized so that a step with decodes stays under an
    /// inter-token-latency target by the engine's cost model (beyond the reference; needs chunking).
    pub step_budget: Option<crate::step_budget::StepBudget>,
    /// The thrash guard (beyond the reference; `scheduler/thrash.rs`): while a request that gave its
    /// KV up to recompute twice or more waits to replay, no younger request that owns nothing (a new
    /// one, or a recompute-paused one's replay) is admitted.
    pub thrash_guard: bool,
    /// Service classes (beyond the reference; `scheduler/classes.rs`): each class's reserved share,
    /// lent while unused; `None`: no classes.
    pub shares: Option<[Share; SERVICE_CLASSES]>,
}

impl Default for Config {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl Config {
    /// The default configuration, as a constant (for a scheduler built in a `static`).
    pub const DEFAULT: Config = Config {
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
        admission: Admission::Fcfs,
        drain_after: 256,
        step_budget: None,
        thrash_guard: false,
        shares: None,
    };

    /// `max_context_length` is below the token budget (unlimited counts as above any limit): a chunk
    /// that fits the budget may be too long. Upstream sets the two equal, so this never holds there.
    pub(crate) const fn context_limit_below_budget(&self) -> bool {
        match (self.max_context_length, self.max_num_tokens) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(m), Some(b)) => m < b,
        }
    }

    /// Checks the configuration: a chunk unit of at least 1 token, VTC weights not both 0, a deadlock
    /// threshold of at least 1 pass, and without chunking a `max_context_length` that is unset or at
    /// least `max_num_tokens` (upstream sets the two equal; where a whole prompt between them reached
    /// the pass, upstream would fail the pass, every pass, for that request: deliberate difference 16).
    pub const fn validate(&self) -> Result<(), crate::Error> {
        if let Some(c) = self.chunking {
            if c.unit == 0 {
                return Err(crate::Error::Invalid("chunk unit must be at least 1 token"));
            }
        }
        if let Admission::Vtc {
            input_weight,
            output_weight,
        } = self.admission
        {
            if input_weight == 0 && output_weight == 0 {
                return Err(crate::Error::Invalid(
                    "VTC needs a positive input or output weight",
                ));
            }
        }
        if self.chunking.is_none() && self.context_limit_below_budget() {
            return Err(crate::Error::Invalid(
                "without chunking, max_context_length must be unset or at least max_num_tokens: \
                 a whole prompt longer than it could never be scheduled",
            ));
        }
        if let Some(b) = self.step_budget {
            if self.chunking.is_none() || b.itl_us == 0 {
                return Err(crate::Error::Invalid(
                    "a step budget needs chunked prefill and a target of at least 1 µs",
                ));
            }
        }
        if let Some(shares) = self.shares {
            let mut slots = 0u64;
            let mut i = 0;
            while i < SERVICE_CLASSES {
                slots += shares[i].requests as u64;
                i += 1;
            }
            if slots > self.max_num_requests as u64 {
                return Err(crate::Error::Invalid(
                    "the service classes' shares of batch slots exceed max_num_requests",
                ));
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
