//! The prefix cache's index: cached blocks by key, open addressing with backward-shift deletion
//! (the table's entries are info indices + 1, 0 for empty; a cached page keeps its entry's position,
//! so a block that moves between pages updates it with no probe). Every insertion and removal bumps the
//! cache's version and the key's stamp (`trial.rs`: a chain's indexed frontier can only move then).

use super::Prefix;
use crate::narrow::u32_of;
use crate::storage::Buffers;

impl<B: Buffers> Prefix<B> {
    pub(super) fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize & (self.index.len() - 1)
    }

    pub(super) fn find(&self, key: u64) -> Option<usize> {
        let mask = self.index.len() - 1;
        let mut k = self.home(key);
        loop {
            let v = self.index[k];
            if v == 0 {
                return None;
            }
            if self.pages[(v - 1) as usize].key == key {
                return Some(k);
            }
            k = (k + 1) & mask;
        }
    }

    /// The page caching the block of `key`.
    pub(in crate::page_pool) fn lookup(&self, key: u64) -> Option<u32> {
        let k = self.find(key)?;
        Some(self.entry((self.index[k] - 1) as usize))
    }

    pub(super) fn index_insert(&mut self, key: u64, at: usize) {
        self.moved(key);
        let mask = self.index.len() - 1;
        let mut k = self.home(key);
        while self.index[k] != 0 {
            k = (k + 1) & mask;
        }
        self.index[k] = u32_of(at) + 1;
        self.pages[at].entry = u32_of(k);
    }

    pub(super) fn index_remove(&mut self, key: u64) {
        self.moved(key);
        let Some(mut hole) = self.find(key) else {
            panic!("a cached page is indexed");
        };
        let mask = self.index.len() - 1;
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let v = self.index[j];
            if v == 0 {
                break;
            }
            let home = self.home(self.pages[(v - 1) as usize].key);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.index[hole] = v;
                self.pages[(v - 1) as usize].entry = u32_of(hole);
                hole = j;
            }
        }
        self.index[hole] = 0;
    }

    /// The cached block moved to page `at` with its index entry's position: the entry names it (no
    /// probe).
    pub(super) fn index_set(&mut self, at: usize) {
        let k = self.pages[at].entry as usize;
        debug_assert_eq!(
            self.find(self.pages[at].key),
            Some(k),
            "a cached page knows its index entry"
        );
        self.index[k] = u32_of(at) + 1;
    }
}
