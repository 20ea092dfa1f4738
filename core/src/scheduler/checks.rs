//! What submission ([`Scheduler::submit`], [`Scheduler::adopt`]) and [`Scheduler::update`] refuse,
//! before anything changes: an inconsistent or duplicate request, an unknown LoRA task, a request or a
//! step too large for the KV backend (beside its adapter, with unified paging), multimodal runs no
//! chunk could hold, an encoder request longer than `max_context_length`, a full table.

use crate::adapter::{PeftBackend, TaskRef};
use crate::config::Window;
use crate::error::{Error, PeftError};
use crate::kv::{AdapterPaging, KvBackend, KvCaps};
use crate::phase::Phase;
use crate::request::RequestSpec;
use crate::storage::Storage;

use super::Scheduler;
use crate::narrow::u32_of;

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Scheduler<K, P, N, T, S>
{
    /// Multimodal runs: ascending, disjoint, non-empty and within the prompt; with chunking, none longer
    /// than `max_context_length` (no chunk could hold it: upstream raises mid-pass, §1.9).
    fn check_mm_runs(&self, spec: &RequestSpec) -> Result<(), Error> {
        let mut end = 0;
        for &(a, b) in &spec.mm_runs {
            if a < end || b <= a || b > spec.prompt {
                return Err(Error::Invalid(
                    "multimodal runs must be ascending, disjoint, non-empty and within the prompt",
                ));
            }
            end = b;
        }
        let longest = spec.mm_runs.iter().map(|&(a, b)| b - a).max().unwrap_or(0);
        match (self.cfg.chunking, self.cfg.max_context_length) {
            (Some(_), Some(m)) if longest > m => Err(Error::Invalid(
                "a bidirectional multimodal run is longer than max_context_length: no chunk could hold it",
            )),
            _ => Ok(()),
        }
    }

    /// An encoder request in the encoder window whose encoder output (its cost: `encoder_len`, else
    /// the prompt) is longer than `max_context_length` but fits the token budget: the pass would reach
    /// it, and an encoder request is never chunked (upstream fails that pass, and every later one:
    /// deliberate difference 16). One over the budget too never fits, and waits as upstream (L03).
    fn check_encoder_length(&self, spec: &RequestSpec) -> Result<(), Error> {
        if spec.phase != Phase::EncoderInit || self.cfg.window != Window::Encoder {
            return Ok(());
        }
        let cost = if spec.encoder_len > 0 {
            spec.encoder_len
        } else {
            spec.prompt
        };
        let over = self.cfg.max_context_length.is_some_and(|m| cost > m);
        if over && self.cfg.max_num_tokens.is_none_or(|b| cost <= b) {
            return Err(Error::Invalid(
                "an encoder request's encoder output is longer than max_context_length: \
                 encoder requests are never chunked, so no pass could schedule it",
            ));
        }
        Ok(())
    }

    pub(super) fn check_spec(&self, spec: &RequestSpec) -> Result<Option<TaskRef>, Error> {
        if spec.position > spec.prompt {
            return Err(Error::Invalid("position is beyond the prompt"));
        }
        if self.table.find(spec.id).is_some() {
            return Err(Error::DuplicateId(spec.id));
        }
        self.check_sizes(spec)?;
        let task = match spec.lora {
            None => None,
            Some(t) => {
                let peft = self.desk.backend();
                if peft.max_device_pages() == u32::MAX {
                    None // no adapter cache configured
                } else {
                    Some(peft.lookup(t).ok_or(PeftError::UnknownTask(t))?)
                }
            }
        };
        if let Some(t) = task {
            self.check_beside_adapter(spec, t)?;
        }
        if self.table.is_full() {
            return Err(Error::CapacityExhausted {
                what: "request table",
                capacity: u32_of(N),
            });
        }
        Ok(task)
    }

    /// Unified paging: a LoRA request's KV must fit in the pool beside its adapter, which it pins
    /// while it runs (else it could never finish: a prefill that never fits, replayed forever).
    pub(super) fn check_beside_adapter(
        &self,
        spec: &RequestSpec,
        task: TaskRef,
    ) -> Result<(), Error> {
        let Some(adapters) = self.kv.caps().adapters else {
            return Ok(());
        };
        let pages = self.desk.backend().pages_of(task);
        let tokens =
            u64::from(spec.prompt) + u64::from(spec.max_new_tokens) + u64::from(spec.draft);
        let limit = adapters
            .max_tokens_beside_adapter(pages)
            .min(u64::from(u32::MAX));
        if tokens > limit {
            return Err(Error::RequestTooLarge {
                id: spec.id,
                tokens,
                limit,
            });
        }
        Ok(())
    }

    /// The per-step and whole-life sizes of a request: beam width at least 1, one step's tokens (beam +
    /// drafts) within `u32`, and prompt + reserved output + drafts within what one request can hold
    /// (capped at `u32::MAX`: token counts are `u32`, so no later sum can overflow).
    pub(super) fn check_sizes(&self, spec: &RequestSpec) -> Result<(), Error> {
        if spec.beam == 0 {
            return Err(Error::Invalid("beam width must be at least 1"));
        }
        let classes = matches!(
            self.cfg.admission,
            crate::config::Admission::Deadline { .. }
        );
        if classes && usize::from(spec.priority) >= crate::config::PRIORITY_CLASSES {
            return Err(Error::Invalid("priority class out of range"));
        }
        if usize::from(spec.class) >= crate::config::SERVICE_CLASSES {
            return Err(Error::Invalid("service class out of range"));
        }
        self.check_mm_runs(spec)?;
        if spec.beam.checked_add(spec.draft).is_none() {
            return Err(Error::Invalid(
                "beam width plus draft tokens overflow one step's token count",
            ));
        }
        let tokens =
            u64::from(spec.prompt) + u64::from(spec.max_new_tokens) + u64::from(spec.draft);
        let limit = self
            .kv
            .limits()
            .max_tokens_per_request
            .min(u64::from(u32::MAX));
        if tokens > limit {
            return Err(Error::RequestTooLarge {
                id: spec.id,
                tokens,
                limit,
            });
        }
        self.check_encoder_length(spec)?;
        // A decoder's encoder output must fit the cross pool (an encoder request's too: it becomes one).
        // No cross pool: no limit here, the pass stops such a request instead (§1.6 step 7).
        let cross = self.kv.caps().cross.map_or(
            u64::MAX,
            super::super::kv::caps::CrossPool::max_cross_tokens,
        );
        if !spec.skip_cross && u64::from(spec.encoder_len) > cross {
            return Err(Error::RequestTooLarge {
                id: spec.id,
                tokens: u64::from(spec.encoder_len),
                limit: cross,
            });
        }
        Ok(())
    }
}
