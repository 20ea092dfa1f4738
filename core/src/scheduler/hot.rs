//! The hot record: what the decode loop reads of a request, by slot (16 bytes), derived from the
//! request's entry in the table (`table.rs`) and kept beside it.

use super::table::Entry;
use crate::ids::TaskSlot;
use crate::phase::Phase;
use crate::request::Ownership;

/// Hot-record bits: the ownership tag is the low three bits.
pub(crate) const OWNERSHIP_BITS: u8 = 0b111;
/// The phase is `GENERATION_IN_PROGRESS`.
const DECODE: u8 = 1 << 3;
/// Marked in flight.
const INFLIGHT: u8 = 1 << 4;
/// Started (spec §1.15).
const STARTED: u8 = 1 << 5;
/// The phase and data allow a recompute pause (spec §1.15, less the in-flight mark): started, not
/// `GENERATION_TO_COMPLETE`, not a generation request carrying multimodal data.
const RECOMPUTABLE: u8 = 1 << 6;
/// A KV connector load into its pages is pending: neither evictable nor a recompute candidate.
const LOADING: u8 = 1 << 7;
/// An active, not in-flight decode step: the fast path's case (under [`READY_MASK`]).
pub(crate) const READY: u8 = Ownership::Active as u8 | DECODE;
/// The bits [`READY`] is compared under.
pub(crate) const READY_MASK: u8 = OWNERSHIP_BITS | DECODE | INFLIGHT;

/// What the decode loop reads of a request, by slot (16 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Hot {
    /// Ownership tag | [`DECODE`] | [`INFLIGHT`].
    pub(crate) code: u8,
    /// The request's phase (phase 1 defers a context or encoder request from it alone).
    pub(crate) phase: Phase,
    /// Adapter task slot, [`TaskSlot::NONE`] without a LoRA task, [`TaskSlot::UNCACHED`] with one but no cache.
    pub(crate) bucket: TaskSlot,
    /// Beam width.
    pub(crate) beam: u32,
    /// Draft tokens.
    pub(crate) draft: u32,
    /// GUARANTEED_NO_EVICT: KV tokens reserved at admission and not yet used by decode steps.
    pub(crate) headroom: u32,
}

impl Default for Hot {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl Hot {
    /// A vacant slot's record (the default one).
    pub(crate) const EMPTY: Hot = Hot {
        code: 0,
        phase: Phase::Unknown,
        bucket: TaskSlot(0),
        beam: 0,
        draft: 0,
        headroom: 0,
    };

    /// The record derived from a request (the headroom is kept: it is not derivable).
    pub(crate) fn derive(e: Entry<'_>, headroom: u32) -> Self {
        let spec = e.spec();
        let decode = if spec.phase == Phase::GenerationInProgress {
            DECODE
        } else {
            0
        };
        let inflight = if e.sits_out() { INFLIGHT } else { 0 };
        let loading = if e.pending_load() { LOADING } else { 0 };
        let started = spec.started();
        let recomputable = started
            && spec.phase != Phase::GenerationToComplete
            && !(spec.phase.is_generation() && spec.multimodal);
        let flags = (u8::from(started) * STARTED) | (u8::from(recomputable) * RECOMPUTABLE);
        let bucket = match (e.task(), spec.lora) {
            (Some(t), _) => t.slot,
            (None, Some(_)) => TaskSlot::UNCACHED,
            (None, None) => TaskSlot::NONE,
        };
        Self {
            code: e.ownership() as u8 | decode | inflight | loading | flags,
            phase: spec.phase,
            bucket,
            beam: spec.beam,
            draft: spec.draft,
            headroom,
        }
    }

    /// The ownership tag.
    #[inline]
    pub(crate) fn ownership(self) -> u8 {
        self.code & OWNERSHIP_BITS
    }

    /// The KV is on the GPU with the lease (`Active` or `Resumed`).
    #[inline]
    pub(crate) fn on_gpu(self) -> bool {
        let o = self.ownership();
        o == Ownership::Active as u8 || o == Ownership::Resumed as u8
    }

    /// A context or encoder request phase 1 defers to phase 2, not in flight (nor waiting on its
    /// encoder): what `generation.rs`'s general step would push to the pending list.
    #[inline]
    pub(crate) fn deferred(self) -> bool {
        matches!(self.phase, Phase::ContextInit | Phase::EncoderInit) && !self.inflight()
    }

    /// In flight.
    #[inline]
    pub(crate) fn inflight(self) -> bool {
        self.code & INFLIGHT != 0
    }

    /// A context request in flight (`Table::contexts_in_flight` counts them).
    #[inline]
    pub(crate) fn context_in_flight(self) -> bool {
        self.inflight() && self.phase == Phase::ContextInit
    }

    /// A KV connector load into its pages is pending.
    #[inline]
    pub(crate) fn loading(self) -> bool {
        self.code & LOADING != 0
    }

    /// Evictable (spec §1.15): not in flight, started, no pending connector load, KV on the GPU.
    #[inline]
    pub(crate) fn evictable(self) -> bool {
        self.idle_started() && self.on_gpu()
    }

    /// Started, not in flight, no pending connector load: evictable wherever its KV is on the GPU.
    #[inline]
    pub(crate) fn idle_started(self) -> bool {
        self.code & (INFLIGHT | STARTED | LOADING) == STARTED
    }

    /// Recompute-pause candidate (spec §1.15): not in flight, no pending connector load, not
    /// `GENERATION_TO_COMPLETE`, not a generation request carrying multimodal data, started. Its KV may
    /// be anywhere.
    #[inline]
    pub(crate) fn recomputable(self) -> bool {
        self.code & (INFLIGHT | RECOMPUTABLE | LOADING) == RECOMPUTABLE
    }
}
