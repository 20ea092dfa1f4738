//! The pool's side of a KV connector ([`crate::connector`]): the offer a first chunk gets past its own
//! prefix match, the load into its new pages, and each slot's load until it is confirmed, fails, times
//! out or is cancelled. A connector needs the prefix cache: it is asked by the prompt's chained block
//! keys.
//!
//! Per slot ([`ConnectorSlot`]): nothing, an offer (made by `prepare_context`, dropped if the chunk's
//! pages are refused), or an unconfirmed load. While a load is unconfirmed its blocks are not committed
//! (the commit waits at its first block and is made when the load is confirmed). A failure not yet
//! handed to the scheduler is kept and handed over by `take_load_changes`, which also polls the
//! connector and counts the passes each load is unconfirmed. A slot whose load failed offers nothing to
//! its replay.

use crate::connector::{KvConnector, LoadEnd};
use crate::ids::RequestId;
use crate::kv::{KvRef, LoadChange};

use super::{KvPool, SeqState};
use crate::narrow::{u16_of, u32_of};
use crate::storage::Buffers;

/// Where a slot's connector load stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
enum Load {
    /// Nothing offered.
    #[default]
    Idle,
    /// The connector offered blocks; the scheduler has not claimed them.
    Offered,
    /// The load into the claimed pages is pending.
    Loading,
}

/// A load's outcome not yet handed to the scheduler (a failure outranks an end).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
enum Outcome {
    /// Nothing to hand over.
    #[default]
    None,
    /// The load was confirmed.
    Ended,
    /// The load failed or timed out.
    Failed,
}

/// Where a slot's save stands (at most one in flight a slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
enum Save {
    /// No save.
    #[default]
    Idle,
    /// In flight for this many passes.
    InFlight(u32),
    /// Ended or abandoned: its pages are to be unpinned.
    Over,
}

/// One request slot's connector state (borrowed storage, one per pool slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ConnectorSlot {
    load: Load,
    /// The request the offer or load is for.
    id: RequestId,
    /// The first offered block and how many.
    first: u32,
    blocks: u32,
    /// Passes the load has been unconfirmed.
    passes: u32,
    /// The prompt tokens computed so far (the last commit asked for while the load was unconfirmed).
    computed: u32,
    /// The outcome not yet handed to the scheduler.
    outcome: Outcome,
    /// A load of this request failed: its replay computes everything.
    refused: bool,
    /// The slot's request's blocks below this were offered to a save.
    saved_upto: u32,
    /// The slot's save: where it stands, the request it is for, and the pages it pins (the blocks
    /// it reads and their ancestors, in the save buffer's row of the slot).
    save: Save,
    save_id: RequestId,
    save_len: u32,
}

impl ConnectorSlot {
    /// A save (in flight or over) still pins its pages.
    fn saving(&self) -> bool {
        self.save != Save::Idle
    }
}

/// The attached connector.
pub(super) struct Attached<'a> {
    connector: &'a mut dyn KvConnector,
    slots: &'a mut [ConnectorSlot],
    /// The pages of each slot's save in flight: a row of `max_blocks` a slot.
    saves: &'a mut [u32],
    /// Passes a load may stay pending before it is abandoned.
    timeout: u32,
    pub(super) stats: ConnectorStats,
}

impl core::fmt::Debug for Attached<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Attached")
            .field("slots", &self.slots)
            .field("timeout", &self.timeout)
            .field("stats", &self.stats)
            .finish()
    }
}

impl Attached<'_> {
    /// Phase 1 of [`KvPool::connector_changes`]: the connector's load ends, marked on their slots (a
    /// failure refuses the slot's replay).
    #[inline]
    fn take_load_ends(&mut self) {
        let (slots, stats) = (&mut *self.slots, &mut self.stats);
        self.connector.take_load_ends(&mut |r, end| {
            // A late end (the slot's load was cancelled, or another request took the slot) is ignored.
            let Some(s) = slots.get_mut(usize::from(r.slot)) else {
                return;
            };
            if s.load != Load::Loading || s.id != r.id {
                return;
            }
            s.load = Load::Idle;
            match end {
                LoadEnd::Done => s.outcome = s.outcome.max(Outcome::Ended),
                LoadEnd::Failed => {
                    s.outcome = Outcome::Failed;
                    s.refused = true;
                    stats.failed += 1;
                }
            }
        });
    }

    /// Phase 2: the connector's save ends, marked on their slots.
    #[inline]
    fn take_save_ends(&mut self) {
        let slots = &mut *self.slots;
        self.connector.take_save_ends(&mut |r| {
            // A late end names the request the save was for; another's is ignored.
            if let Some(s) = slots.get_mut(usize::from(r.slot)) {
                if s.saving() && s.save_id == r.id {
                    s.save = Save::Over;
                }
            }
        });
    }

    /// Phase 3: one more pass for each save and load in flight; one past the timeout is cancelled (a
    /// load's failure refuses the slot's replay).
    #[inline]
    fn tick_timeouts(&mut self) {
        for (i, s) in self.slots.iter_mut().enumerate() {
            if let Save::InFlight(passes) = s.save {
                s.save = Save::InFlight(passes + 1);
                if passes + 1 > self.timeout {
                    self.stats.saves_timed_out += 1;
                    self.connector.cancel_save(KvRef {
                        slot: u16_of(i),
                        id: s.save_id,
                    });
                    s.save = Save::Over;
                }
            }
            if s.load == Load::Loading {
                s.passes += 1;
                if s.passes > self.timeout {
                    s.load = Load::Idle;
                    s.outcome = Outcome::Failed;
                    s.refused = true;
                    self.stats.timed_out += 1;
                    self.connector.cancel_load(KvRef {
                        slot: u16_of(i),
                        id: s.id,
                    });
                }
            }
        }
    }
}

/// Counters of connector activity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ConnectorStats {
    /// Blocks offered to first chunks (counted as reused).
    pub offered_blocks: u64,
    /// Loads started.
    pub loads: u64,
    /// Blocks loaded by loads that were started.
    pub loaded_blocks: u64,
    /// Loads that failed.
    pub failed: u64,
    /// Loads abandoned after the timeout.
    pub timed_out: u64,
    /// Loads cancelled because the request's cache was freed.
    pub cancelled: u64,
    /// Saves started.
    pub saves: u64,
    /// Blocks the saves read.
    pub saved_blocks: u64,
    /// Saves abandoned after the timeout.
    pub saves_timed_out: u64,
}

impl<'a, B: Buffers> KvPool<'a, B> {
    /// Attaches a KV connector (a prefix cache is required: the connector is asked by block keys).
    /// `slots` holds one [`ConnectorSlot`] per pool slot, `saves` the pages of the saves in flight
    /// ([`super::KvPoolConfig::table_len`] entries); a load still unconfirmed, or a save still in
    /// flight, after `timeout` passes is abandoned (the load's request recomputes). Refused (nothing
    /// changes) without a prefix cache, with buffers of the wrong length, a zero timeout, or a connector
    /// attached already.
    pub fn attach_connector(
        &mut self,
        connector: &'a mut dyn KvConnector,
        slots: &'a mut [ConnectorSlot],
        saves: &'a mut [u32],
        timeout: u32,
    ) -> Result<(), crate::Error> {
        if self.prefix.is_none() {
            return Err(crate::Error::Invalid(
                "a KV connector needs the pool's prefix cache (it is asked by block keys)",
            ));
        }
        if slots.len() != self.cfg.slots as usize
            || saves.len() != self.cfg.table_len()
            || timeout == 0
            || self.connector.is_some()
        {
            return Err(crate::Error::Invalid(
                "connector slots must match the pool's slots, the timeout be at least 1 pass, and one connector attached",
            ));
        }
        slots.fill(ConnectorSlot::default());
        self.connector = Some(Attached {
            connector,
            slots,
            saves,
            timeout,
            stats: ConnectorStats::default(),
        });
        Ok(())
    }

    /// The connector's counters (`None` without one).
    pub fn connector_stats(&self) -> Option<ConnectorStats> {
        self.connector.as_ref().map(|c| c.stats)
    }

    /// A request slot's unconfirmed load, if any: its first block and block count.
    pub fn unconfirmed_load(&self, slot: u16) -> Option<(u32, u32)> {
        let s = self.connector.as_ref()?.slots.get(usize::from(slot))?;
        (s.load == Load::Loading).then_some((s.first, s.blocks))
    }

    /// A new request takes the slot: it may use the connector, and what its predecessor left unsaid is
    /// forgotten.
    pub(super) fn connector_new_request(&mut self, slot: usize) {
        if let Some(c) = self.connector.as_mut() {
            // A save of the slot's previous request stays in flight, pinning its pages.
            let s = c.slots[slot];
            c.slots[slot] = ConnectorSlot {
                save: s.save,
                save_id: s.save_id,
                save_len: s.save_len,
                ..ConnectorSlot::default()
            };
        }
    }

    /// The slot's prompt blocks are committed up to its `committed` count: the ones not yet offered
    /// are offered to a save (when none is in flight for the slot), and pinned if it is accepted.
    pub(super) fn connector_save(&mut self, r: KvRef, slot: usize) {
        let Some(c) = self.connector.as_mut() else {
            return;
        };
        let s = c.slots[slot];
        let committed = self.seqs[slot].committed;
        if s.saving() || committed <= s.saved_upto {
            return;
        }
        let base = slot * self.cfg.max_blocks as usize;
        let (from, to) = (s.saved_upto as usize, committed as usize);
        // The save reads the new blocks; it pins them with their ancestors, so that a pinned block's
        // parent is pinned too (the prefix cache evicts leaves first: an unpinned parent of a pinned
        // block could never go).
        c.saves[base..base + to].copy_from_slice(&self.tables[base..base + to]);
        c.slots[slot].saved_upto = committed;
        if !c
            .connector
            .start_save(r, &c.saves[base + from..base + to], s.saved_upto)
        {
            return;
        }
        let slot_state = &mut c.slots[slot];
        slot_state.save = Save::InFlight(0);
        slot_state.save_id = r.id;
        slot_state.save_len = u32_of(to);
        c.stats.saves += 1;
        c.stats.saved_blocks += (to - from) as u64;
        let Some(prefix) = self.prefix.as_mut() else {
            return;
        };
        for &p in &c.saves[base..base + to] {
            prefix.hold(p);
        }
    }

    /// Unpins the pages of slot `slot`'s save in flight.
    fn connector_save_done(&mut self, slot: usize) {
        let (Some(c), Some(prefix)) = (self.connector.as_mut(), self.prefix.as_mut()) else {
            return;
        };
        let s = &mut c.slots[slot];
        if !s.saving() {
            return;
        }
        s.save = Save::Idle;
        let base = slot * self.cfg.max_blocks as usize;
        for &p in &c.saves[base..base + s.save_len as usize] {
            prefix.unhold(p);
        }
    }

    /// The saves' pins agree with their pages: every page of a save in flight is a cached block, and the
    /// holds on all pages are the saves' pages.
    pub(super) fn connector_check(&self) -> bool {
        let (Some(c), Some(prefix)) = (self.connector.as_ref(), self.prefix.as_ref()) else {
            return true;
        };
        let mut pinned = 0u64;
        for (i, s) in c.slots.iter().enumerate().filter(|(_, s)| s.saving()) {
            let base = i * self.cfg.max_blocks as usize;
            for &p in &c.saves[base..base + s.save_len as usize] {
                let info = prefix.info(p);
                if !info.cached() || info.holds() == 0 {
                    return false;
                }
            }
            pinned += u64::from(s.save_len);
        }
        pinned == prefix.total_holds()
    }

    /// A first chunk matched `matched` blocks in the pool: the connector's offer of the next ones,
    /// within `limit` blocks in all. Returns the offered blocks (recorded for the chunk's resize).
    pub(super) fn connector_offer(
        &mut self,
        r: KvRef,
        slot: usize,
        matched: u32,
        limit: u32,
    ) -> u32 {
        let Some(c) = self.connector.as_mut() else {
            return 0;
        };
        let s = &mut c.slots[slot];
        if s.refused || s.load == Load::Loading || matched >= limit {
            return 0;
        }
        let seq = self.seqs[slot];
        let base = slot * self.cfg.max_blocks as usize;
        let hashes = &self.hashes[base + matched as usize..base + limit as usize];
        let blocks = c
            .connector
            .matched_blocks(r, matched, seq.chain, hashes)
            .min(limit - matched);
        *s = ConnectorSlot {
            load: if blocks > 0 {
                Load::Offered
            } else {
                Load::Idle
            },
            id: r.id,
            first: matched,
            blocks,
            ..*s
        };
        c.stats.offered_blocks += u64::from(blocks);
        blocks
    }

    /// The chunk's pages are in place: an offer becomes a load into them.
    pub(super) fn connector_start(&mut self, r: KvRef, slot: usize) {
        let Some(c) = self.connector.as_mut() else {
            return;
        };
        let s = c.slots[slot];
        if s.load != Load::Offered || s.id != r.id {
            return;
        }
        let base = slot * self.cfg.max_blocks as usize;
        let (a, b) = (
            base + s.first as usize,
            base + (s.first + s.blocks) as usize,
        );
        debug_assert!(
            self.seqs[slot].blocks >= s.first + s.blocks,
            "the resize holds the offered blocks"
        );
        c.connector.start_load(r, &self.tables[a..b], s.first);
        c.stats.loads += 1;
        c.stats.loaded_blocks += u64::from(s.blocks);
        let slot_state = &mut c.slots[slot];
        slot_state.load = Load::Loading;
        slot_state.passes = 0;
        slot_state.computed = 0;
    }

    /// How far the slot's prompt blocks may be committed: an unconfirmed load's blocks wait (the
    /// computed position is kept, and committed when the load is confirmed).
    pub(super) fn connector_commit_limit(&mut self, slot: usize, computed: u32) -> u32 {
        let tpb = self.cfg.tokens_per_block;
        let Some(s) = self.connector.as_mut().map(|c| &mut c.slots[slot]) else {
            return computed;
        };
        if s.load != Load::Loading {
            return computed;
        }
        s.computed = s.computed.max(computed);
        computed.min(s.first * tpb)
    }

    /// The slot's cache is gone (freed, preempted, or a refused first chunk rolled back): an offer is
    /// dropped, a pending load cancelled.
    pub(super) fn connector_drop(&mut self, r: KvRef, slot: usize) {
        let Some(c) = self.connector.as_mut() else {
            return;
        };
        let s = &mut c.slots[slot];
        match s.load {
            Load::Offered => s.load = Load::Idle,
            Load::Loading => {
                s.load = Load::Idle;
                c.stats.cancelled += 1;
                c.connector.cancel_load(r);
            }
            Load::Idle => {}
        }
    }

    /// [`crate::kv::Transfers::take_load_changes`]: polls the connector, abandons loads past the
    /// timeout, commits the confirmed ones, and hands over every slot's end or failure.
    pub(super) fn connector_changes(&mut self, f: &mut dyn FnMut(u16, LoadChange)) {
        let Some(c) = self.connector.as_mut() else {
            return;
        };
        c.take_load_ends();
        c.take_save_ends();
        c.tick_timeouts();
        self.hand_over_changes(f);
    }

    /// Phase 4 of [`Self::connector_changes`]: frees the pages of each ended or abandoned save, commits
    /// each confirmed load, and hands every slot's end or failure to `f`.
    #[inline]
    fn hand_over_changes(&mut self, f: &mut dyn FnMut(u16, LoadChange)) {
        for i in 0..self.seqs.len() {
            let Some(c) = self.connector.as_mut() else {
                return;
            };
            if c.slots[i].save == Save::Over {
                // Ended or abandoned: the pages are free to go.
                self.connector_save_done(i);
            }
            let Some(c) = self.connector.as_mut() else {
                return;
            };
            let s = &mut c.slots[i];
            let (outcome, computed, id) = (core::mem::take(&mut s.outcome), s.computed, s.id);
            if outcome == Outcome::Failed {
                f(u16_of(i), LoadChange::Failed);
            } else if outcome == Outcome::Ended {
                // Confirmed: the blocks the load wrote join the prefix cache with what was computed,
                // and may be saved.
                if matches!(self.seqs[i].state, SeqState::Active | SeqState::Claimed) {
                    self.commit_row(i, computed);
                    self.connector_save(
                        KvRef {
                            slot: u16_of(i),
                            id,
                        },
                        i,
                    );
                }
                f(u16_of(i), LoadChange::Ended);
            }
        }
    }

    pub(super) fn connector_hash<H: core::hash::Hasher>(&self, h: &mut H) {
        use core::hash::Hash;
        if let Some(c) = &self.connector {
            c.slots.hash(h);
            c.stats.hash(h);
        }
    }
}
