//! What a handler hands the engine's thread ([`Job`]) and what it hears back ([`Event`]).

use kvsched_engine::{BeamSearch, BeamSequence, Logprob, Sample};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::UnboundedSender;

use crate::worker::Ticket;

/// Why a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The model's stop token (or a stop string).
    Stop,
    /// `max_tokens` tokens.
    Length,
    /// The server aborted it (shutting down past its deadline).
    Abort,
}

impl End {
    /// The OpenAI `finish_reason`.
    pub const fn reason(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
        }
    }
}

/// What the engine thread tells a request's handler.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The engine first ran the request in the step that began then; its first chunk found this
    /// many prompt positions in the prefix cache.
    Scheduled(Instant, usize),
    /// Tokens generated since the last event, and their log probabilities (when asked for).
    Tokens(Vec<u32>, Vec<Logprob>),
    /// The request is over.
    Done(End),
    /// A beam search's sequences, best first (then [`Event::Done`]).
    Beams(Vec<BeamSequence>),
    /// The engine refused or failed the request.
    Failed(String),
}

/// A request for the engine thread.
#[derive(Debug)]
pub struct Job {
    /// Prompt tokens.
    pub prompt: Vec<u32>,
    /// Tokens to generate at most.
    pub max_new: usize,
    /// The adapter (its engine id), or the base model.
    pub adapter: Option<u64>,
    /// The request's hold on its adapter, given back when its last sample ends.
    pub hold: Option<crate::adapters::Held>,
    /// Its cache salt.
    pub cache_salt: u64,
    /// Its priority in the scheduler (vLLM's `priority` + 128: the lower, the sooner).
    pub priority: u8,
    /// Its service class (`--class-share`).
    pub class: u8,
    /// Its samples (one per choice drawn: `n`, or vLLM's `best_of`): how each draws, where its
    /// events go, and its place among the admitted requests (a sample takes an engine slot). A
    /// beam search's: the first's events, every one's place (its beams).
    pub samples: Vec<(Sample, UnboundedSender<Event>, Ticket)>,
    /// Sampling, or a beam search.
    pub mode: Mode,
}

/// How a request's choices are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// Each sample its own draw.
    Samples,
    /// vLLM's beam search, as many beams as samples.
    Beams(BeamSearch),
}

/// A cache salt's key: FNV-1a over its bytes (the same on every replica and restart), never 0 (the
/// unsalted root).
pub fn salt(s: &str) -> u64 {
    let h = s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    h.max(1)
}

/// A seed no earlier request had: the clock mixed with the request counter.
pub fn fresh_seed(n: u64) -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}
