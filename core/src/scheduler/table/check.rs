//! The table's invariants (1–3 of `table.rs`, and its counts), checked whole or one slot at a time,
//! and its state fed to a hasher.

use crate::request::Ownership;
use crate::storage::Storage;

use super::{Entry, Hot, Record, Table};

impl<const N: usize, S: Storage> Table<N, S> {
    /// Feeds the table's whole state to `h`.
    pub(crate) fn hash_state<H: core::hash::Hasher>(&self, h: &mut H) {
        use core::hash::Hash;
        self.records.hash_state(h, Record::hash_state);
        for held in self.held.iter() {
            match held {
                None => 0u8.hash(h),
                Some(x) => x.hash_state(h),
            }
        }
        self.hot.hash(h);
        self.order.hash(h);
        self.ids.hash_state(h);
        self.resumed.hash(h);
        self.resumed_slots.hash(h);
        self.resumed_overflow.hash(h);
    }

    /// Invariants 1–3 of the module.
    pub(crate) fn check(&self) -> bool {
        if !self.records.check() || self.records.len() != self.order.len() {
            return false;
        }
        let live = self.held.iter().filter(|h| h.is_some()).count();
        let resumed = self
            .order
            .iter()
            .filter(|&&s| self.hot[s as usize].ownership() == Ownership::Resumed as u8)
            .count();
        if live != self.order.len() || resumed != self.resumed as usize {
            return false;
        }
        let contexts = self
            .order
            .iter()
            .filter(|&&s| self.hot[s as usize].context_in_flight())
            .count();
        if contexts != self.contexts_in_flight as usize {
            return false;
        }
        let listed = |s: u16| self.resumed_overflow || self.resumed_slots.contains(&s);
        if self
            .order
            .iter()
            .any(|&s| self.hot[s as usize].ownership() == Ownership::Resumed as u8 && !listed(s))
        {
            return false;
        }
        distinct(&self.order) && self.order.iter().all(|&s| self.entry_ok(s))
    }

    /// One slot's part of invariants 1–3 in O(1): a held entry's hot record derives from it, the id
    /// index and its place name the slot at its version; a vacant slot holds nothing. The spot check of
    /// a request a pass touched (`Scheduler::check_requests`).
    pub(crate) fn check_slot(&self, s: u16) -> bool {
        match self.held.get(usize::from(s)) {
            None => false,
            Some(None) => self.records.at(s).is_none(),
            Some(Some(_)) => self.entry_ok(s),
        }
    }

    fn entry_ok(&self, s: u16) -> bool {
        let (Some(record), Some(held)) = (self.records.at(s), &self.held[s as usize]) else {
            return false;
        };
        let place = held.place();
        let e = Entry {
            record,
            held: &self.held[s as usize],
        };
        self.hot[s as usize] == Hot::derive(e, self.hot[s as usize].headroom)
            && self.ids.get(record.spec.id) == Some(s)
            && place.slot == s
            && place.version == self.records.version_at(s)
            && held.id() == record.spec.id
    }
}

/// Whether `slots` names no slot twice: O(length) per window of 4,096 slots the largest one spans,
/// with the window's bits on the stack (512 bytes).
fn distinct(slots: &[u16]) -> bool {
    const WINDOW: usize = 4096;
    let largest = slots.iter().copied().max().map_or(0, usize::from);
    (0..=largest / WINDOW).all(|w| {
        let mut seen = [0u64; WINDOW / 64];
        let mut in_window = slots
            .iter()
            .map(|&s| usize::from(s))
            .filter(|s| s / WINDOW == w);
        in_window.all(|s| {
            let (word, bit) = ((s % WINDOW) / 64, 1u64 << (s % 64));
            let fresh = seen[word] & bit == 0;
            seen[word] |= bit;
            fresh
        })
    })
}
