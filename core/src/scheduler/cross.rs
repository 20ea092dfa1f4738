//! The cross (encoder-output) cache of a decoder context (spec §1.7 step 6): after the target's pages
//! are in place, a decoder chunk with an encoder output creates (first chunk only) or resumes its cross
//! cache and grows it to the encoder length. Without a cross pool the admission stops; a refusal skips
//! the request, suspending a first chunk's cross cache when its resize was refused (as upstream).
//!
//! Upstream then suspends the request's target and draft caches for any result but SCHEDULED. Here a
//! request that owns its KV with a lease (an active continuation) keeps it: suspending it would need the
//! suspension transition and a `paused` listing the reference does not make (difference 10 in
//! docs/conformance-format.md); every other request (first chunk, replay, a suspended continuation that
//! was resumed for this chunk) has its caches suspended as upstream, and the roll-back frees a first
//! chunk's.

use crate::adapter::PeftBackend;
use crate::kv::{CrossPool, KvBackend, KvCaps};
use crate::storage::Storage;

use super::pass::{Pass, Step};

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// Gives an admitted decoder chunk its cross cache; `Err` with the step to take when it cannot.
    pub(crate) fn attach_cross(&mut self, slot: u16, first: bool) -> Result<(), Step> {
        let s = self.table.entry(slot).spec();
        let (encoder_len, skip) = (s.encoder_len, s.skip_cross);
        if encoder_len == 0 || skip {
            return Ok(());
        }
        let r = self.kv_ref(slot);
        let step = match self.kv.cross() {
            None => Step::Stop,
            Some(x) => {
                let prepared = x.prepare_cross(r, first);
                if prepared && x.resize_cross(r, encoder_len) {
                    return Ok(());
                }
                // Upstream suspends a first chunk's cross cache only when its resize is refused: one
                // that could not be created or resumed is left to the roll-back, which frees it.
                if first && prepared {
                    x.suspend_cross(r);
                }
                Step::Skip
            }
        };
        if !self.table.entry(slot).ownership().on_gpu() {
            self.kv.suspend(r);
        }
        Err(step)
    }
}
