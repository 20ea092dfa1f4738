//! `--disagg P:D`: prefill/decode disaggregation. `P` prefill engines compute the prompts of the
//! requests the router sends them as context-only requests; when a prompt is computed its KV is
//! pinned for the send (`DISAGG_CONTEXT_TRANS_IN_PROGRESS`) and the request is handed to one of `D`
//! decode engines (the least loaded). There it arrives as `DISAGG_GENERATION_INIT`: a pass prepares
//! its whole prompt's pages, the transfer runs (latency plus the prompt's KV bytes over the link's
//! bandwidth), and both ends learn when it ended: the decode engine's `end_receive` makes the request
//! decode, the prefill engine's `end_send` frees its pages. A decode engine short of pages leaves the
//! request waiting with its KV pinned on the prefill side — the back-pressure disaggregation lives
//! with.
//!
//! The first token is the prefill engine's (its TTFT); the decode engine produces the rest (the TPOT
//! includes the wait for the transfer).

/// `--disagg P:D[:LATENCY_US[:GBPS]]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DisaggOptions {
    /// Prefill engines.
    pub prefill: u32,
    /// Decode engines.
    pub decode: u32,
    /// Latency of one transfer, µs.
    pub latency_us: f64,
    /// The link's bandwidth, GB/s.
    pub gbps: f64,
}

impl DisaggOptions {
    /// The engines in all.
    pub fn engines(&self) -> u32 {
        self.prefill + self.decode
    }

    /// How long a prompt of `tokens` takes to move, ms.
    pub fn transfer_ms(&self, tokens: u32) -> f64 {
        let bytes = super::cost::LLAMA3_8B_KV_BYTES_PER_TOKEN * f64::from(tokens);
        (self.latency_us + bytes / (self.gbps * 1000.0)) / 1000.0
    }
}

/// A disaggregation specification [`DisaggOptions::from_str`](std::str::FromStr::from_str) refused
/// (quoted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected P:D[:LATENCY_US[:GBPS]] with P, D ≥ 1, got {0:?}")]
pub struct BadDisagg(pub String);

impl std::str::FromStr for DisaggOptions {
    type Err = BadDisagg;

    /// Parses `P:D[:LATENCY_US[:GBPS]]`: P, D ≥ 1, the others positive (defaults 50 µs, 50 GB/s).
    fn from_str(v: &str) -> Result<Self, BadDisagg> {
        let bad = || BadDisagg(v.to_owned());
        let mut it = v.split(':');
        let mut count = || {
            it.next()
                .and_then(|x| x.parse::<u32>().ok())
                .filter(|&x| x > 0)
        };
        let (prefill, decode) = (count().ok_or_else(bad)?, count().ok_or_else(bad)?);
        // One RDMA link (NIXL over 400 Gb/s InfiniBand): tens of µs, 50 GB/s.
        let latency_us = super::cluster::positive_or(it.next(), 50.0).ok_or_else(bad)?;
        let gbps = super::cluster::positive_or(it.next(), 50.0).ok_or_else(bad)?;
        if it.next().is_some() {
            return Err(bad());
        }
        Ok(Self {
            prefill,
            decode,
            latency_us,
            gbps,
        })
    }
}

/// What an engine does in a disaggregated cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// Both phases (no disaggregation).
    #[default]
    Mixed,
    /// Prompts only: context-only requests that send their KV.
    Prefill,
    /// Decode only: requests that receive their prompt's KV.
    Decode,
}

impl Role {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Role::Mixed => "mixed",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

/// A request whose prompt a prefill engine computed, on its way to a decode engine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Handoff {
    /// The arrival.
    pub arrival: usize,
    /// When the prompt was computed (the first token), ms.
    pub at_ms: f64,
}

/// A transfer a decode engine started: when it ends, ms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransferEndAt {
    /// The arrival.
    pub arrival: usize,
    /// When the last byte lands — or, when the transfer failed or stalled, when both ends learn it
    /// (its end, or its start plus `--link-faults`' timeout).
    pub at_ms: f64,
    /// Whether every page arrived (`--link-faults` fails some).
    pub delivered: bool,
}

/// What the transfers did, for the report.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct DisaggFigures {
    /// Prefill engines.
    pub prefill_engines: u32,
    /// Decode engines.
    pub decode_engines: u32,
    /// Prompts moved from a prefill to a decode engine.
    pub transfers: u64,
    /// Their KV, GB.
    pub transfer_gb: f64,
    /// From a prompt's end on the prefill engine to its KV in place on the decode engine (queueing for
    /// decode pages included), ms.
    pub handoff_ms: super::report::Quantiles,
}
