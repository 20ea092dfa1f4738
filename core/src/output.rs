//! The scheduler output: fixed-capacity lists and the adapter plan.
//!
//! The context and generation lists accept only [`Schedulable`] requests ([`crate::request::Active`] and
//! [`crate::request::Resumed`]); a suspended request cannot be put in a batch.

use crate::adapter::TaskRef;
use crate::request::{Request, RequestId, Schedulable, TaskId};

/// One listed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Listed {
    /// Request id.
    pub id: RequestId,
    /// Dense table slot.
    pub slot: u16,
    /// Context: chunk size in tokens (0 for other lists).
    pub chunk: u32,
    /// Context: this chunk ends the prompt.
    pub last: bool,
    /// LoRA task id (0 without an adapter; see `lora`).
    pub key: u64,
    /// The request has a LoRA adapter (sort key: no adapter first, then ascending task id).
    pub lora: bool,
    /// Adapter task slot (`u16::MAX` when none).
    pub bucket: u16,
}

/// No adapter bucket.
pub const NO_BUCKET: u16 = u16::MAX;

/// A fixed-capacity list of `N` requests.
pub type List<const N: usize> = heapless::Vec<Listed, N>;

/// What one pass decided.
#[derive(Debug, Clone, Default)]
pub struct SchedulerOutput<const N: usize> {
    /// Context chunks to run (non-final chunks first when any, each part sorted by LoRA key).
    pub context: List<N>,
    /// Decode steps to run (sorted by LoRA key).
    pub generation: List<N>,
    /// Encoder requests to run.
    pub encoder: List<N>,
    /// Ordinarily suspended requests (victims and self-evictions).
    pub paused: List<N>,
    /// Destructively freed requests (recompute pause and preemption victims): reset them for replay.
    pub recompute_paused: List<N>,
    /// Disaggregated generation requests whose transfer may start.
    pub disagg: List<N>,
    /// Requests whose KV came back this pass (their lower-tier pages must be copied up first).
    pub resumed: List<N>,
    /// Distinct adapters the scheduled batch needs on the device (the adapter plan).
    pub adapters: heapless::Vec<TaskRef, N>,
    /// Adapters that had to be copied to the device (filled by `ensure_batch`).
    pub adapter_loads: heapless::Vec<TaskRef, N>,
    /// A scheduled context chunk is not the last one.
    pub has_chunking: bool,
}

impl<const N: usize> SchedulerOutput<N> {
    /// An empty output.
    pub const fn new() -> Self {
        Self {
            context: heapless::Vec::new(),
            generation: heapless::Vec::new(),
            encoder: heapless::Vec::new(),
            paused: heapless::Vec::new(),
            recompute_paused: heapless::Vec::new(),
            disagg: heapless::Vec::new(),
            resumed: heapless::Vec::new(),
            adapters: heapless::Vec::new(),
            adapter_loads: heapless::Vec::new(),
            has_chunking: false,
        }
    }

    /// Empties every list.
    pub fn clear(&mut self) {
        self.context.clear();
        self.generation.clear();
        self.encoder.clear();
        self.paused.clear();
        self.recompute_paused.clear();
        self.disagg.clear();
        self.resumed.clear();
        self.adapters.clear();
        self.adapter_loads.clear();
        self.has_chunking = false;
    }

    /// Encoders + contexts + generations (disagg excluded).
    pub fn num_fitting(&self) -> usize {
        self.encoder.len() + self.context.len() + self.generation.len()
    }

    /// Adds a decode step for a schedulable request.
    pub fn push_generation<S: Schedulable>(&mut self, request: &Request<S>, lora: Option<TaskId>) {
        let r = request.kv_ref();
        let bucket = request.task().map_or(NO_BUCKET, |t| t.slot);
        // Cannot overflow: at most one entry per live request, and the table holds N.
        let _ = self.generation.push(Listed {
            id: r.id,
            slot: r.slot,
            chunk: 0,
            last: false,
            key: lora.map_or(0, |t| t.0),
            lora: lora.is_some(),
            bucket,
        });
    }

    /// Adds a context chunk for a schedulable request.
    pub fn push_context<S: Schedulable>(
        &mut self,
        request: &Request<S>,
        chunk: u32,
        last: bool,
        lora: Option<TaskId>,
    ) {
        let r = request.kv_ref();
        let bucket = request.task().map_or(NO_BUCKET, |t| t.slot);
        self.has_chunking |= !last;
        let _ = self.context.push(Listed {
            id: r.id,
            slot: r.slot,
            chunk,
            last,
            key: lora.map_or(0, |t| t.0),
            lora: lora.is_some(),
            bucket,
        });
    }

    /// Ids of a list, for tests and tools.
    pub fn ids(list: &List<N>) -> impl Iterator<Item = u64> + '_ {
        list.iter().map(|l| l.id.0)
    }
}

/// The LoRA sort key (spec §1.13): (0, 0) without an adapter, (1, task id) with one, as one integer.
#[inline]
pub(crate) fn lora_key(l: &Listed) -> u128 {
    (u128::from(l.lora) << 64) | u128::from(l.key)
}

/// Sorts `list` stably by LoRA key (no adapter first, then ascending task id); with `partition`, non-final
/// chunks go first. Uses `scratch` and `counts` (one `[part 0, part 1]` counter pair per adapter task slot;
/// no allocation). Cost: O(n) when already sorted, or when every LoRA entry's adapter bucket is one of the
/// pass's distinct adapters (given in ascending id order in `adapters_by_id`): a counting sort that touches
/// only those adapters' counters; otherwise a bottom-up merge sort, O(n log n).
pub(crate) fn sort_by_lora<const N: usize>(
    list: &mut List<N>,
    scratch: &mut [Listed; N],
    partition: bool,
    adapters_by_id: &[TaskRef],
    counts: &mut [[u32; 2]],
) {
    let full_key = |l: &Listed| {
        if partition {
            (u128::from(l.last) << 65) | lora_key(l)
        } else {
            lora_key(l)
        }
    };
    if list.windows(2).all(|w| full_key(&w[0]) <= full_key(&w[1])) {
        return;
    }
    let counted = !adapters_by_id.is_empty()
        && if partition {
            counting_sort::<N, true>(list, scratch, adapters_by_id, counts)
        } else {
            counting_sort::<N, false>(list, scratch, adapters_by_id, counts)
        };
    if counted {
        return;
    }
    merge_sort(list, scratch, full_key);
}

/// [`sort_by_lora`] without partition, for a list counted as it was filled: `counts[slot][0]` holds the
/// entries of each task of `adapters_by_id`, `plain` those without an adapter. If the counts do not
/// account for every entry (an entry with a key but no bucket), the list is counted again as
/// [`sort_by_lora`] does.
pub(crate) fn sort_counted<const N: usize>(
    list: &mut List<N>,
    scratch: &mut [Listed; N],
    adapters_by_id: &[TaskRef],
    counts: &mut [[u32; 2]],
    plain: u32,
) {
    if list.windows(2).all(|w| lora_key(&w[0]) <= lora_key(&w[1])) {
        return;
    }
    if !place::<N, false>(list, scratch, adapters_by_id, counts, [plain, 0]) {
        sort_by_lora(list, scratch, false, adapters_by_id, counts);
    }
}

/// The counting sort of [`sort_by_lora`]: bucket "no adapter", then one bucket per adapter in id order, per
/// part. Returns false, changing nothing in `list`, when an entry's bucket is not one of `adapters_by_id`.
fn counting_sort<const N: usize, const PARTITION: bool>(
    list: &mut List<N>,
    scratch: &mut [Listed; N],
    adapters_by_id: &[TaskRef],
    counts: &mut [[u32; 2]],
) -> bool {
    let part = |l: &Listed| usize::from(PARTITION && l.last);
    let mut plain = [0u32; 2];
    for t in adapters_by_id {
        match counts.get_mut(t.slot as usize) {
            Some(c) => *c = [0, 0],
            None => return false,
        }
    }
    for l in list.iter() {
        if !l.lora {
            plain[part(l)] += 1;
        } else {
            match counts.get_mut(l.bucket as usize) {
                Some(c) => c[part(l)] += 1,
                None => return false, // no bucket (no adapter cache)
            }
        }
    }
    place::<N, PARTITION>(list, scratch, adapters_by_id, counts, plain)
}

/// The placement of the counting sort, from the counts (`counts[slot]` for the tasks of `adapters_by_id`,
/// `plain` for the entries without an adapter). Returns false, changing nothing in `list`, when the counts
/// do not add up to the list's length.
fn place<const N: usize, const PARTITION: bool>(
    list: &mut List<N>,
    scratch: &mut [Listed; N],
    adapters_by_id: &[TaskRef],
    counts: &mut [[u32; 2]],
    mut plain: [u32; 2],
) -> bool {
    let part = |l: &Listed| usize::from(PARTITION && l.last);
    for t in adapters_by_id {
        if counts.get(t.slot as usize).is_none() {
            return false;
        }
    }
    // Start offsets, in place: part 0 (no adapter, adapters by id), then part 1. An entry whose bucket
    // is not in the plan was counted in a stale counter the prefix never visits: the total falls short.
    let mut acc = 0u32;
    for p in 0..if PARTITION { 2 } else { 1 } {
        let c = plain[p];
        plain[p] = acc;
        acc += c;
        for t in adapters_by_id {
            let c = &mut counts[t.slot as usize][p];
            let v = *c;
            *c = acc;
            acc += v;
        }
    }
    if acc as usize != list.len() {
        return false;
    }
    // One block copy (heapless' extend_from_slice moves element by element).
    let scratch = &mut scratch[..list.len()];
    scratch.copy_from_slice(list);
    for l in scratch.iter() {
        let p = part(l);
        let slot = if !l.lora {
            &mut plain[p]
        } else {
            &mut counts[l.bucket as usize][p]
        };
        list[*slot as usize] = *l;
        *slot += 1;
    }
    true
}

fn merge_sort<const N: usize>(
    list: &mut List<N>,
    scratch: &mut [Listed; N],
    key: impl Fn(&Listed) -> u128,
) {
    let n = list.len();
    let scratch = &mut scratch[..n];
    let mut width = 1;
    let mut from_list = true;
    while width < n {
        {
            let (src, dst): (&[Listed], &mut [Listed]) = if from_list {
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

    /// Test keys: 0 = no adapter, k > 0 = task k - 1.
    fn l(id: u64, key: u64, last: bool) -> Listed {
        Listed {
            id: RequestId(id),
            slot: id as u16,
            chunk: 0,
            last,
            key: key.saturating_sub(1),
            lora: key > 0,
            bucket: NO_BUCKET,
        }
    }

    #[test]
    fn merge_sort_is_stable_and_partitions() {
        let mut list: List<16> = heapless::Vec::new();
        for (i, k) in [3u64, 1, 0, 2, 1, 0, 3].iter().enumerate() {
            list.push(l(i as u64, *k, i % 2 == 0)).unwrap();
        }
        let mut scratch = [Listed::default(); 16];
        let mut counts = [[0u32; 2]; 8];
        sort_by_lora(&mut list, &mut scratch, false, &[], &mut counts);
        let ids: heapless::Vec<u64, 16> = list.iter().map(|x| x.id.0).collect();
        assert_eq!(&ids[..], &[2, 5, 1, 4, 3, 0, 6]);
        sort_by_lora(&mut list, &mut scratch, true, &[], &mut counts);
        let ids: heapless::Vec<u64, 16> = list.iter().map(|x| x.id.0).collect();
        // Non-final (odd ids) first, each part by key.
        assert_eq!(&ids[..], &[5, 1, 3, 2, 4, 0, 6]);
    }

    #[test]
    fn precounted_sort_matches_and_falls_back() {
        let tasks = [
            TaskRef {
                id: TaskId(2),
                slot: 1,
            },
            TaskRef {
                id: TaskId(5),
                slot: 0,
            },
        ];
        let mut a: List<64> = heapless::Vec::new();
        let (mut plain, mut counts) = (0u32, [[0u32; 2]; 8]);
        for i in 0..30u64 {
            let t = (i * 7 % 3) as usize;
            let (key, bucket) = if t == 2 {
                plain += 1;
                (0, NO_BUCKET)
            } else {
                counts[tasks[t].slot as usize][0] += 1;
                (tasks[t].id.0, tasks[t].slot)
            };
            a.push(Listed {
                id: RequestId(i),
                slot: i as u16,
                key,
                lora: t != 2,
                bucket,
                ..Listed::default()
            })
            .unwrap();
        }
        let mut scratch = [Listed::default(); 64];
        let mut expect = a.clone();
        let mut fresh = [[0u32; 2]; 8];
        sort_by_lora(&mut expect, &mut scratch, false, &tasks, &mut fresh);
        let mut got = a.clone();
        sort_counted(&mut got, &mut scratch, &tasks, &mut counts, plain);
        assert_eq!(got, expect);
        // Counts that miss an entry (an adapter without a bucket): counted again, same order.
        let mut b = a.clone();
        b[3].bucket = NO_BUCKET;
        let mut expect = b.clone();
        sort_by_lora(&mut expect, &mut scratch, false, &tasks, &mut fresh);
        let mut got = b.clone();
        let mut short = [[0u32; 2]; 8];
        sort_counted(&mut got, &mut scratch, &tasks, &mut short, plain);
        assert_eq!(got, expect);
    }

    #[test]
    fn counting_sort_matches_merge_sort() {
        let mut a: List<64> = heapless::Vec::new();
        let tasks = [
            TaskRef {
                id: TaskId(5),
                slot: 0,
            },
            TaskRef {
                id: TaskId(2),
                slot: 1,
            },
        ];
        for i in 0..40u64 {
            let t = (i * 7 % 3) as usize;
            let (key, bucket) = if t == 2 {
                (0, NO_BUCKET)
            } else {
                (tasks[t].id.0, tasks[t].slot)
            };
            a.push(Listed {
                id: RequestId(i),
                slot: i as u16,
                chunk: 0,
                last: i % 3 == 0,
                key,
                lora: t != 2,
                bucket,
            })
            .unwrap();
        }
        let mut b = a.clone();
        for l in b.iter_mut() {
            l.bucket = NO_BUCKET;
        }
        let mut by_id = tasks;
        by_id.sort_unstable_by_key(|t| t.id);
        let mut scratch = [Listed::default(); 64];
        let mut counts = [[0u32; 2]; 8];
        for partition in [false, true] {
            let (mut x, mut y) = (a.clone(), b.clone());
            sort_by_lora(&mut x, &mut scratch, partition, &by_id, &mut counts);
            sort_by_lora(&mut y, &mut scratch, partition, &by_id, &mut counts);
            let xi: heapless::Vec<u64, 64> = x.iter().map(|l| l.id.0).collect();
            let yi: heapless::Vec<u64, 64> = y.iter().map(|l| l.id.0).collect();
            assert_eq!(xi, yi);
        }
    }
}
