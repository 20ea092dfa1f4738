//! The prefix cache's part of the planted faults (`page_pool/faults.rs`, feature `fault-injection`).

use super::Prefix;
use crate::narrow::u32_of;
use crate::storage::Buffers;

impl<B: Buffers> Prefix<B> {
    /// The page of `entry` counts one reference more than the rows naming it.
    pub(in crate::page_pool) fn plant_extra_ref(&mut self, entry: u32) {
        let at = self.at(entry);
        self.pages[at].refs += 1;
    }

    /// An empty index slot names the (free) page of `entry`; `false` when the index has no empty slot.
    pub(in crate::page_pool) fn plant_orphan(&mut self, entry: u32) -> bool {
        let at = self.at(entry);
        match self.index.iter_mut().find(|v| **v == 0) {
            Some(v) => {
                *v = u32_of(at) + 1;
                true
            }
            None => false,
        }
    }
}
