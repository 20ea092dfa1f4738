//! The reference: one request at a time, the whole prompt in one pass, its keys and values in a
//! contiguous cache of its own. Identity tests compare the paged step against it.

use crate::error::{EngineError, Result};
use crate::lora::Lora;
use crate::math::argmax;
use crate::model::{Context, Model, Span};

/// A contiguous KV cache, written at each layer before attention reads it.
struct Cache {
    kv_dim: usize,
    capacity: usize,
    len: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl Context for Cache {
    fn context(
        &mut self,
        _span: usize,
        layer: usize,
        _from: usize,
        new_k: &[f32],
        new_v: &[f32],
    ) -> Result<(usize, &[f32], &[f32])> {
        let at = self.len * self.kv_dim;
        let end = at + new_k.len();
        self.k[layer][at..end].copy_from_slice(new_k);
        self.v[layer][at..end].copy_from_slice(new_v);
        Ok((0, &self.k[layer][..end], &self.v[layer][..end]))
    }
}

/// One request run alone: feed it tokens (a whole prompt, then one token at a time) and read the
/// logits of the last one.
pub struct Reference<'m> {
    model: &'m Model,
    cache: Cache,
    adapter: Option<Lora>,
}

impl std::fmt::Debug for Reference<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reference")
            .field("len", &self.cache.len)
            .field("capacity", &self.cache.capacity)
            .field("adapter", &self.adapter.is_some())
            .finish()
    }
}

impl<'m> Reference<'m> {
    /// A request of at most `capacity` positions (at most the model's context length) on the base
    /// model, or on `adapter`.
    pub fn new(model: &'m Model, capacity: usize, adapter: Option<Lora>) -> Self {
        let c = model.config();
        let capacity = capacity.min(c.context_length);
        let size = capacity * c.kv_dim();
        Self {
            model,
            cache: Cache {
                kv_dim: c.kv_dim(),
                capacity,
                len: 0,
                k: vec![vec![0.0; size]; c.blocks],
                v: vec![vec![0.0; size]; c.blocks],
            },
            adapter,
        }
    }

    /// Positions computed so far.
    pub fn len(&self) -> usize {
        self.cache.len
    }

    /// Whether nothing was fed yet.
    pub fn is_empty(&self) -> bool {
        self.cache.len == 0
    }

    /// Runs `tokens` at the next positions in one pass and returns the last one's logits.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let c = self.model.config();
        if tokens.is_empty() {
            return Err(EngineError::Batch("no tokens to feed".into()));
        }
        if self.cache.len + tokens.len() > self.cache.capacity {
            return Err(EngineError::Batch(format!(
                "{} positions exceed the reference's capacity of {}",
                self.cache.len + tokens.len(),
                self.cache.capacity
            )));
        }
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= c.vocab) {
            return Err(EngineError::Batch(format!(
                "token {t} is outside the vocabulary"
            )));
        }
        let span = Span {
            start: self.cache.len,
            row0: 0,
            len: tokens.len(),
            adapter: self.adapter.as_ref().map(|_| 0),
        };
        let adapters = self.adapter.as_slice();
        let last = [tokens.len() - 1];
        let (logits, _) = self
            .model
            .forward(tokens, &[span], adapters, &mut self.cache, &last)?;
        self.cache.len += tokens.len();
        Ok(logits)
    }

    /// Greedy generation: the prompt in one pass, then up to `max_new` tokens one at a time,
    /// stopping after a stop token ([`crate::Tokenizer::is_stop`]). Returns the new tokens.
    pub fn generate(&mut self, prompt: &[u32], max_new: usize) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(max_new);
        if max_new == 0 {
            return Ok(out);
        }
        let mut logits = self.feed(prompt)?;
        loop {
            let next = argmax(&logits);
            out.push(next);
            if out.len() == max_new || self.model.tokenizer().is_stop(next) {
                return Ok(out);
            }
            logits = self.feed(&[next])?;
        }
    }
}
