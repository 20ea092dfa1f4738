//! The LoRA sort (spec §1.13): each list stably by LoRA key — no adapter first, then ascending task id —
//! and the context list, when any chunk is not the last, non-final chunks first.
//!
//! The plan's adapters are sorted by id first; an entry's key is then its adapter's rank in the plan
//! (0 without an adapter), so the sort is a counting sort over the plan's buckets, O(n). The generation
//! list was counted as it was filled; the others are counted here. Entries with a LoRA task but no
//! adapter-cache bucket (no adapter cache configured) have no rank: the lists are then merge-sorted by
//! their task ids read from the table, O(n log n). An already sorted list is left as it is.
//!
//! Invariant: the sort permutes each list (no entry lost or duplicated), stably.

use core::ops::DerefMut;

use crate::adapter::PeftBackend;
use crate::ids::TaskSlot;
use crate::kv::KvBackend;
use crate::output::{Chunk, Listed};
use crate::storage::Storage;

use super::pass::Pass;
use super::table::Table;
use crate::narrow::u16_of;

/// A sortable list entry.
trait Item: Copy {
    fn listed(&self) -> Listed;
    /// The partition bit (a final chunk goes after every non-final one).
    fn last(&self) -> bool;
}

impl Item for Listed {
    #[inline]
    fn listed(&self) -> Listed {
        *self
    }
    #[inline]
    fn last(&self) -> bool {
        false
    }
}

impl Item for Chunk {
    #[inline]
    fn listed(&self) -> Listed {
        self.listed
    }
    #[inline]
    fn last(&self) -> bool {
        self.last
    }
}

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// Sorts the batch lists in place, with the scratch buffers.
    pub(crate) fn sort(&mut self, (listed, chunks): (&mut [Listed; N], &mut [Chunk; N])) {
        let partition = self.out.has_chunking();
        let unbucketed = self.plan.unbucketed > 0;
        let table = &*self.table;
        let (generation, context, encoder, adapters) = self.out.sortable();
        if adapters.len() > 1 {
            adapters.sort_unstable_by_key(|t| t.id);
        }
        let plan = &mut *self.plan;
        for (k, t) in adapters.iter().enumerate() {
            plan.rank[t.slot.index()] = u16_of(k) + 1;
        }
        if unbucketed {
            merge_sort(generation, listed, |l| id_key(table, l, false));
            merge_sort(encoder, listed, |l| id_key(table, l, false));
            merge_sort(context, chunks, |c| id_key(table, c, partition));
            return;
        }
        let plain = [plan.plain, 0];
        let (rank, counts) = (&plan.rank, &mut plan.counts);
        sort_counted(generation, listed, adapters, rank, counts, plain, false);
        count_and_sort(encoder, listed, adapters, rank, counts, false);
        count_and_sort(context, chunks, adapters, rank, counts, partition);
    }
}

/// The rank key: partition bit, then the adapter's rank in the plan (0 without an adapter).
#[inline]
fn rank_key<I: Item, const T: usize>(rank: &[u16; T], item: &I, partition: bool) -> u32 {
    let l = item.listed();
    let r = if l.bucket() == TaskSlot::NONE {
        0
    } else {
        u32::from(rank[l.bucket().index()])
    };
    (u32::from(partition && item.last()) << 16) | r
}

/// The full key from the table: partition bit, LoRA bit, task id.
fn id_key<I: Item, const N: usize, S: Storage>(
    table: &Table<N, S>,
    item: &I,
    partition: bool,
) -> u128 {
    let lora = table.entry(item.listed().slot()).spec().lora;
    let key = lora.map_or(0, |t| (1u128 << 64) | u128::from(t.0));
    (u128::from(partition && item.last()) << 65) | key
}

/// Counts `list` per bucket, then places it.
fn count_and_sort<I: Item, L: DerefMut<Target = [I]>, const N: usize, const T: usize>(
    list: &mut L,
    scratch: &mut [I; N],
    adapters: &[crate::adapter::TaskRef],
    rank: &[u16; T],
    counts: &mut [[u32; 2]; T],
    partition: bool,
) {
    if list.len() < 2 {
        return;
    }
    let mut plain = [0u32; 2];
    for t in adapters {
        counts[t.slot.index()] = [0, 0];
    }
    for item in list.iter() {
        let l = item.listed();
        let part = usize::from(partition && item.last());
        if l.bucket() == TaskSlot::NONE {
            plain[part] += 1;
        } else {
            counts[l.bucket().index()][part] += 1;
        }
    }
    sort_counted(list, scratch, adapters, rank, counts, plain, partition);
}

/// Places `list` by the counts (`counts[slot]` for the plan's adapters, `plain` for the entries without
/// one), unless it is sorted already.
fn sort_counted<I: Item, L: DerefMut<Target = [I]>, const N: usize, const T: usize>(
    list: &mut L,
    scratch: &mut [I; N],
    adapters: &[crate::adapter::TaskRef],
    rank: &[u16; T],
    counts: &mut [[u32; 2]; T],
    mut plain: [u32; 2],
    partition: bool,
) {
    if list
        .windows(2)
        .all(|w| rank_key(rank, &w[0], partition) <= rank_key(rank, &w[1], partition))
    {
        return;
    }
    // Start offsets, in place: part 0 (no adapter, then the adapters by id), then part 1.
    let mut acc = 0u32;
    for p in 0..if partition { 2 } else { 1 } {
        let c = plain[p];
        plain[p] = acc;
        acc += c;
        for t in adapters {
            let c = &mut counts[t.slot.index()][p];
            let v = *c;
            *c = acc;
            acc += v;
        }
    }
    assert_eq!(acc as usize, list.len(), "the counts cover the list");
    let scratch = &mut scratch[..list.len()];
    scratch.copy_from_slice(list);
    for item in scratch.iter() {
        let l = item.listed();
        let p = usize::from(partition && item.last());
        let at = if l.bucket() == TaskSlot::NONE {
            &mut plain[p]
        } else {
            &mut counts[l.bucket().index()][p]
        };
        list[*at as usize] = *item;
        *at += 1;
    }
}

/// A stable bottom-up merge sort by `key`.
fn merge_sort<I: Item, L: DerefMut<Target = [I]>, const N: usize>(
    list: &mut L,
    scratch: &mut [I; N],
    key: impl Fn(&I) -> u128,
) {
    let n = list.len();
    if list.windows(2).all(|w| key(&w[0]) <= key(&w[1])) {
        return;
    }
    let scratch = &mut scratch[..n];
    let mut width = 1;
    let mut from_list = true;
    while width < n {
        {
            let (src, dst): (&[I], &mut [I]) = if from_list {
                (&list[..], &mut *scratch)
            } else {
                (&*scratch, &mut list[..])
            };
            let mut lo = 0;
            while lo < n {
                let mid = (lo + width).min(n);
                let hi = (lo + 2 * width).min(n);
                let (mut a, mut b, mut o) = (lo, mid, lo);
                while a < mid && b < hi {
                    if key(&src[b]) < key(&src[a]) {
                        dst[o] = src[b];
                        b += 1;
                    } else {
                        dst[o] = src[a];
                        a += 1;
                    }
                    o += 1;
                }
                dst[o..o + (mid - a)].copy_from_slice(&src[a..mid]);
                o += mid - a;
                dst[o..o + (hi - b)].copy_from_slice(&src[b..hi]);
                lo = hi;
            }
        }
        from_list = !from_list;
        width *= 2;
    }
    if !from_list {
        list.copy_from_slice(scratch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapter::TaskRef;
    use crate::ids::TaskId;
    use crate::output::{List, Listed};

    /// Entries over three adapters (slots 0..3 with ids 5, 2, 9) and none, in a scrambled order; the
    /// counting sort and the merge sort by (partition, task id) agree, stably.
    #[test]
    fn counting_sort_matches_a_stable_merge_sort() {
        let tasks = [(0u16, 5u64), (1, 2), (2, 9)];
        let mut by_id: heapless::Vec<TaskRef, 4> = tasks
            .iter()
            .map(|&(slot, id)| TaskRef {
                id: TaskId(id),
                slot: TaskSlot(slot),
            })
            .collect();
        by_id.sort_unstable_by_key(|t| t.id);
        let mut rank = [0u16; 4];
        for (k, t) in by_id.iter().enumerate() {
            rank[t.slot.index()] = k as u16 + 1;
        }
        let id_of = |bucket: u16| tasks.iter().find(|t| t.0 == bucket).map(|t| t.1);
        let mut list: List<Chunk, 64> = heapless::Vec::new();
        let mut seed = 0x9e37_79b9u32;
        for i in 0..50u16 {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let bucket = match (seed >> 16) % 4 {
                3 => TaskSlot::NONE,
                b => TaskSlot(b as u16),
            };
            let chunk = Chunk {
                listed: Listed::for_test(i, bucket),
                tokens: u32::from(i),
                last: (seed >> 20) % 3 == 0,
            };
            assert!(list.push(chunk).is_ok());
        }
        for partition in [false, true] {
            let key = |c: &Chunk| {
                let lora =
                    id_of(c.listed.bucket().0).map_or(0, |id| (1u128 << 64) | u128::from(id));
                (u128::from(partition && c.last) << 65) | lora
            };
            let mut expect = list.clone();
            let mut scratch = [Chunk::default(); 64];
            merge_sort(&mut expect, &mut scratch, key);
            let mut got = list.clone();
            let mut counts = [[0u32; 2]; 4];
            count_and_sort(
                &mut got,
                &mut scratch,
                &by_id,
                &rank,
                &mut counts,
                partition,
            );
            assert_eq!(got, expect, "partition {partition}");
            assert!(got.windows(2).all(|w| key(&w[0]) <= key(&w[1])));
        }
    }
}
