//! A request the engine holds: its tokens, where its KV stands, how it draws, what it reports.

use super::options::Extras;
use crate::Sampler;
use kvsched_core::Handle;

/// A request the engine holds.
#[derive(Debug)]
pub(super) struct Live {
    pub(super) handle: Handle,
    pub(super) id: u64,
    /// Prompt, then the generated tokens.
    pub(super) tokens: Vec<u32>,
    pub(super) prompt: usize,
    pub(super) max_new: usize,
    /// Positions its KV holds (0 after a recompute pause).
    pub(super) computed: usize,
    pub(super) adapter: Option<u64>,
    pub(super) sampler: Sampler,
    pub(super) logits: Vec<Vec<f32>>,
    /// The draft tokens proposed for this step (speculative decoding).
    pub(super) draft: Vec<u32>,
    /// A context-only request (disaggregated serving: its KV is sent once its prompt is computed).
    pub(super) context_only: bool,
    /// A transferred request's prompt pages, until they are written into its pages.
    pub(super) incoming: Option<Vec<Vec<u8>>>,
    /// Its prompt blocks' keys in the prefix cache, when the engine logs KV events.
    pub(super) keys: Vec<u64>,
    /// Its guide, log probabilities and cached positions.
    pub(super) extras: Extras,
}

impl Live {
    pub(super) fn generated(&self) -> usize {
        self.tokens.len() - self.prompt
    }

    /// A request's state before its first step: `tokens` its prompt.
    pub(super) fn new(
        handle: Handle,
        id: u64,
        tokens: Vec<u32>,
        (max_new, adapter, sampler): (usize, Option<u64>, Sampler),
    ) -> Self {
        let prompt = tokens.len();
        Self {
            handle,
            id,
            tokens,
            prompt,
            max_new,
            computed: 0,
            adapter,
            sampler,
            logits: Vec::new(),
            draft: Vec::new(),
            context_only: false,
            incoming: None,
            keys: Vec::new(),
            extras: Extras::default(),
        }
    }
}
