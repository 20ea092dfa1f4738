//! GUARANTEED_NO_EVICT on KV groups: reservations in pages, per group.
//!
//! A reservation by capacity (the default [`crate::kv::KvBackend::resize_reserving`]) would grow every group to
//! the request's whole length and leave its capacity ahead of its tokens, where a window group gives
//! up the wrong pages. The groups reserve in pages instead, each group what the request will hold
//! there at most at once (its *peak*):
//!
//! - a full-attention group, the blocks of the whole request (prompt, output, drafts);
//! - a window group of `W` tokens, what this chunk holds or, if more, the blocks of `W − 1` tokens
//!   and the largest later step, plus one for the alignment (`blocks(W − 1 + step) + 1`); never more
//!   than the request's blocks after those it already gave up. Its first decode step narrows it to
//!   the window and that step (a later step with more drafts, after an update, is not covered).
//!
//! A row's *claim* is its peak less what it holds; a group's claims are the sum over its rows. The
//! groups keep, in every pool, **available ≥ claims (+ shared, in a window group)**: available are
//! the GPU pages that can be had (free, or cached and idle); shared are the references beyond each
//! page's first. A window row releasing a block gives its page back (idle, or free) and its claim
//! grows by one; where another row still holds the block nothing comes back, and the shared count
//! drops by one instead: a hit on a held block costs a page of the slack, so that the release can
//! be paid. Every operation checks the inequality after it acts and undoes a growth that would
//! break it (so a reserved request's growth is always paid for, by its claim), and admission
//! refuses a reservation that does not fit: the request waits, and admissions close, as for the
//! reservation by capacity. Capacities stay the tokens computed, so decode steps ask for their
//! tokens ([`crate::kv::KvLimits::reserves`]).

use super::{Attention, PoolGroups};
use crate::kv::{KvRef, Reservation};

use super::GroupPool;

impl<P: GroupPool, const G: usize> PoolGroups<P, G> {
    /// Every pool keeps reservations in pages.
    pub(super) fn counts(&self) -> bool {
        self.groups.iter().all(|g| g.pool.pool_pages().is_some())
    }

    /// Per group, what the request's reservation still promises.
    fn promised(&self, slot: u16) -> [u32; G] {
        core::array::from_fn(|g| self.groups[g].pool.row_pages(slot).promised())
    }

    /// Runs `op`, which acts on request `r` only, keeping the claims in step with it.
    pub(super) fn counted<T>(&mut self, r: KvRef, op: impl FnOnce(&mut Self) -> T) -> T {
        if !self.reserving {
            return op(self);
        }
        let before = self.promised(r.slot);
        let out = op(self);
        let after = self.promised(r.slot);
        for g in 0..G {
            self.claims[g] = self.claims[g] + after[g] - before[g];
        }
        out
    }

    /// Runs `op` ([`Self::counted`]); where it succeeded but the pages no longer cover the
    /// reservations, runs `undo` (counted too) and fails.
    pub(super) fn guarded(
        &mut self,
        r: KvRef,
        op: impl FnOnce(&mut Self) -> bool,
        undo: impl FnOnce(&mut Self),
    ) -> bool {
        if !self.counted(r, op) {
            return false;
        }
        if self.backed() {
            return true;
        }
        self.counted(r, |k| k.compensate(undo));
        false
    }

    /// Every pool's pages cover what its reservations promise ([the module docs](self)).
    pub(super) fn backed(&self) -> bool {
        !self.reserving
            || self.groups.iter().zip(self.claims).all(|(g, claims)| {
                let Some(p) = g.pool.pool_pages() else {
                    return true;
                };
                let shared = match g.attention {
                    Attention::Full => 0,
                    Attention::Sliding { .. } => p.shared,
                };
                u64::from(p.available) >= u64::from(claims) + u64::from(shared)
            })
    }

    /// The claims are their rows' (O(slots)), and the pages cover them.
    pub(super) fn claims_agree(&self) -> bool {
        let slots = u16::try_from(self.groups[0].pool.geometry().slots).unwrap_or(u16::MAX);
        let mut sums = [0u64; G];
        for slot in 0..slots {
            for (g, sum) in sums.iter_mut().enumerate() {
                *sum += u64::from(self.groups[g].pool.row_pages(slot).promised());
            }
        }
        sums.iter()
            .zip(self.claims)
            .all(|(&s, c)| s == u64::from(c))
            && self.backed()
    }

    /// The most pages group `g` holds of the request at once, until it completes.
    fn peak(&self, g: usize, slot: u16, reservation: Reservation) -> u32 {
        let group = &self.groups[g];
        let tpb = group.pool.geometry().tokens_per_block;
        let blocks = |tokens: u32| tokens.div_ceil(tpb);
        let row = group.pool.row_pages(slot);
        let peak = match group.attention {
            Attention::Full => blocks(reservation.tokens),
            Attention::Sliding { window } => {
                // What it holds now (this chunk's), or what a later step's window holds.
                let span = blocks((window - 1).saturating_add(reservation.step)).saturating_add(1);
                blocks(reservation.tokens)
                    .saturating_sub(row.released)
                    .min(span.max(row.held))
            }
        };
        // A later chunk's reservation never grows (its steps are within the first one's).
        if row.peak > 0 {
            peak.min(row.peak)
        } else {
            peak
        }
    }

    /// A decode step of `step` tokens: a window group's reservation narrows to what the window and
    /// such a step hold (the chunk that set it is done), or to what it holds now if more.
    pub(super) fn narrow_reservation(&mut self, r: KvRef, step: u32) {
        if !self.reserving {
            return;
        }
        for g in &mut self.groups {
            let Attention::Sliding { window } = g.attention else {
                continue;
            };
            let row = g.pool.row_pages(r.slot);
            let tpb = g.pool.geometry().tokens_per_block;
            let span = ((window - 1).saturating_add(step)).div_ceil(tpb) + 1;
            if row.peak > span.max(row.held) {
                g.pool.set_peak(r, span.max(row.held));
            }
        }
    }

    /// [`crate::kv::KvBackend::resize_reserving`] in pages: the chunk's growth, then every group's peak, all
    /// refused (the growth undone, a first chunk left inactive) where the pages do not cover them.
    pub(super) fn reserve(
        &mut self,
        r: KvRef,
        capacity: u32,
        reservation: Reservation,
        first_chunk: bool,
    ) -> bool {
        self.reserving = true;
        let old: [u32; G] = core::array::from_fn(|g| self.groups[g].pool.row_pages(r.slot).peak);
        let set = |k: &mut Self| {
            if !k.grow_context(r, capacity, first_chunk) {
                return false;
            }
            for g in 0..G {
                let peak = k.peak(g, r.slot, reservation);
                k.groups[g].pool.set_peak(r, peak);
            }
            true
        };
        let undo = |k: &mut Self| {
            for (g, &peak) in old.iter().enumerate() {
                k.groups[g].pool.set_peak(r, peak);
            }
            k.undo_context(r, first_chunk);
        };
        self.guarded(r, set, undo)
    }
}
