//! Snapshots: pending while their step runs, ready once it is committed, least recently used first
//! out ([the pool's docs](super)).

use super::{Capture, StatePool, Use};
use crate::ids::RequestId;
use crate::narrow::u32_of;
use crate::storage::Storage;

impl<const C: usize, S: Storage> StatePool<C, S> {
    /// Snapshots held (pending and ready).
    pub fn snapshots(&self) -> u32 {
        u32_of(
            self.gpu_slots()
                .iter()
                .filter(|u| matches!(u, Use::Snapshot { .. }))
                .count(),
        )
    }

    /// The ready snapshot under `key`, if any (side-effect free).
    pub fn find(&self, key: u64) -> Option<u32> {
        self.gpu_slots()
            .iter()
            .position(|u| matches!(*u, Use::Snapshot { key: k, ready: true, .. } if k == key))
            .map(u32_of)
    }

    /// The ready snapshots: `(slot, position, key)` each.
    pub fn ready(&self) -> impl Iterator<Item = (u32, u32, u64)> + '_ {
        self.gpu_slots()
            .iter()
            .enumerate()
            .filter_map(|(g, u)| match *u {
                Use::Snapshot {
                    key,
                    ready: true,
                    position,
                    ..
                } => Some((u32_of(g), position, key)),
                _ => None,
            })
    }

    /// Where the snapshot in `slot` was taken (`None`: no snapshot there).
    pub fn snapshot_position(&self, slot: u32) -> Option<u32> {
        match self.gpu.get(slot as usize) {
            Some(Use::Snapshot { position, .. }) => Some(*position),
            _ => None,
        }
    }

    pub(super) fn is_ready(&self, slot: u32) -> bool {
        matches!(
            self.gpu_slots().get(slot as usize),
            Some(Use::Snapshot { ready: true, .. })
        )
    }

    /// Marks the snapshot in `slot` used now.
    pub(super) fn touch(&mut self, slot: u32) {
        self.clock += 1;
        if let Some(Use::Snapshot { used, .. }) = self.gpu.get_mut(slot as usize) {
            *used = self.clock;
        }
    }

    /// The least recently used ready snapshot, not `spare`.
    pub(super) fn oldest_ready(&self, spare: Option<u32>) -> Option<u32> {
        let mut best: Option<(u64, u32)> = None;
        for (g, u) in self.gpu_slots().iter().enumerate() {
            if let Use::Snapshot {
                ready: true, used, ..
            } = *u
            {
                let g = u32_of(g);
                if Some(g) != spare && best.is_none_or(|(b, _)| used < b) {
                    best = Some((used, g));
                }
            }
        }
        best.map(|(_, g)| g)
    }

    /// Row `row` (request `id`) will pass `position` in this step: a slot is set aside for its state
    /// there under `key`, pending until [`StatePool::commit`], and the capture is logged. Within the
    /// bound, evicting the least recently used ready snapshot at the bound or when no slot is free;
    /// `false` (nothing changed) when no slot can be had, or `key` is already held.
    pub fn capture(&mut self, row: u16, id: RequestId, key: u64, position: u32) -> bool {
        if self.cfg.snapshot_slots == 0 || !self.log.captures.has_room() || self.holds(key) {
            return false;
        }
        if self.snapshots() >= self.cfg.snapshot_slots {
            let Some(old) = self.oldest_ready(None) else {
                return false;
            };
            self.gpu[old as usize] = Use::Free;
            self.stats.evicted += 1;
        }
        let Some(g) = self.take_gpu(None) else {
            return false;
        };
        self.clock += 1;
        self.gpu[g as usize] = Use::Snapshot {
            key,
            ready: false,
            row,
            used: self.clock,
            position,
        };
        self.log.captures.push(Capture {
            request: id,
            position,
            slot: g,
        });
        true
    }

    /// A snapshot under `key` is held, pending or ready.
    fn holds(&self, key: u64) -> bool {
        self.gpu_slots()
            .iter()
            .any(|u| matches!(*u, Use::Snapshot { key: k, .. } if k == key))
    }

    /// Row `row`'s step is done, its first `computed` tokens scanned: its pending snapshots at or
    /// before them are ready; later ones (their chunk ran shorter, or not at all) are dropped.
    pub fn commit(&mut self, row: u16, computed: u32) {
        for u in &mut self.gpu[..self.cfg.gpu_slots as usize] {
            if let Use::Snapshot {
                ready: ready @ false,
                row: r,
                position,
                ..
            } = u
            {
                if *r == row {
                    if *position <= computed {
                        *ready = true;
                        self.stats.snapshots += 1;
                    } else {
                        *u = Use::Free;
                    }
                }
            }
        }
    }

    /// Drops row `row`'s pending snapshots (a chunk that will not run as planned).
    pub fn drop_pending(&mut self, row: u16) {
        for u in &mut self.gpu[..self.cfg.gpu_slots as usize] {
            if matches!(*u, Use::Snapshot { ready: false, row: r, .. } if r == row) {
                *u = Use::Free;
            }
        }
    }

    /// Drops every ready snapshot; returns how many.
    pub fn drop_ready(&mut self) -> u32 {
        let mut n = 0;
        for u in &mut self.gpu[..self.cfg.gpu_slots as usize] {
            if matches!(*u, Use::Snapshot { ready: true, .. }) {
                *u = Use::Free;
                n += 1;
            }
        }
        self.stats.evicted += u64::from(n);
        n
    }
}
