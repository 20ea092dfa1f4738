//! The plain-old-data wire form of a [`SchedulerOutput`]: a fixed little-endian byte layout that can be
//! broadcast to tensor/pipeline-parallel ranks as bytes, without serialization libraries (upstream's
//! `SerializableSchedulerOutput`, spec §1.14). The ranks know requests by id, so every entry carries the
//! request's id next to its slot.
//!
//! Layout (version 2): a 48-byte header (`magic`, `version`, eight list lengths as `u32`, a flags word, a
//! reserved word) followed by the entries of the seven request lists in order (context, generation,
//! encoder, paused, recompute-paused, disagg, resumed), 24 bytes each (`id: u64`, `version: u32`,
//! `tokens: u32`, `slot: u16`, `task: u16`, `last: u8`, 3 bytes zero; `tokens` and `last` are 0 outside
//! the context list), then the adapter plan, 16 bytes per task (`id: u64`, `slot: u16`, 6 bytes zero).
//!
//! Decoding yields a [`WireOutput`]: plain data for the receiving rank. It is not a
//! [`SchedulerOutput`]: no scheduler accepts it back, so bytes cannot forge a batch.

use crate::adapter::TaskRef;
use crate::ids::TaskSlot;
use crate::ids::{RequestId, TaskId};
use crate::narrow::u32_of;
use crate::output::{Listed, SchedulerOutput};
use crate::storage::Storage;

/// `"KVSO"` little-endian.
pub const MAGIC: u32 = 0x4f53_564b;
/// Layout version.
pub const VERSION: u32 = 2;
const HEADER: usize = 48;
const ENTRY: usize = 24;
const TASK: usize = 16;

/// Why a buffer could not be encoded or decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// The buffer is shorter than the layout needs.
    Short {
        /// Bytes needed.
        needed: usize,
        /// Bytes given.
        got: usize,
    },
    /// Not a kvsched output (magic) or another layout version.
    BadHeader,
    /// A list is longer than the receiving output's capacity.
    TooLong,
    /// A listed request has no id any more (it was removed after the pass).
    Stale,
}

impl core::fmt::Display for WireError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Short { needed, got } => {
                write!(f, "wire buffer too short: need {needed} bytes, got {got}")
            }
            Self::BadHeader => f.write_str("not a kvsched scheduler output of this version"),
            Self::TooLong => f.write_str("a list is longer than the receiving output's capacity"),
            Self::Stale => f.write_str("a listed request was removed after the pass"),
        }
    }
}

impl core::error::Error for WireError {}

/// One decoded entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WireEntry {
    /// Request id.
    pub id: RequestId,
    /// Table slot on the scheduling rank.
    pub slot: u16,
    /// The slot's version.
    pub version: u32,
    /// Adapter task slot (`None` without one).
    pub task: Option<TaskSlot>,
    /// Context: tokens of the chunk (0 elsewhere).
    pub tokens: u32,
    /// Context: the chunk ends the prompt.
    pub last: bool,
}

/// A decoded output: the lists as the scheduling rank sent them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WireOutput<const N: usize> {
    /// The seven request lists, in wire order: context, generation, encoder, paused, recompute-paused,
    /// disagg, resumed.
    pub lists: [heapless::Vec<WireEntry, N>; 7],
    /// The adapter plan.
    pub adapters: heapless::Vec<TaskRef, N>,
    /// A context chunk is not the last one.
    pub has_chunking: bool,
}

impl<const N: usize> WireOutput<N> {
    /// The context list.
    pub fn context(&self) -> &[WireEntry] {
        &self.lists[0]
    }
    /// The generation list.
    pub fn generation(&self) -> &[WireEntry] {
        &self.lists[1]
    }
}

/// The entries of the seven lists in wire order, as (listed request, tokens, last).
fn entries<const N: usize, S: Storage>(
    o: &SchedulerOutput<N, S>,
) -> impl Iterator<Item = (Listed, u32, bool)> + '_ {
    let context = o.context().iter().map(|c| (c.listed, c.tokens, c.last));
    let others = o
        .request_lists()
        .into_iter()
        .flat_map(|l| l.iter().map(|&x| (x, 0, false)));
    context.chain(others)
}

fn lens<const N: usize, S: Storage>(o: &SchedulerOutput<N, S>) -> [usize; 8] {
    let r = o.request_lists();
    [
        o.context().len(),
        r[0].len(),
        r[1].len(),
        r[2].len(),
        r[3].len(),
        r[4].len(),
        r[5].len(),
        o.adapters().len(),
    ]
}

/// Bytes the wire form of `out` takes.
pub fn encoded_len<const N: usize, S: Storage>(out: &SchedulerOutput<N, S>) -> usize {
    let l = lens(out);
    HEADER + l[..7].iter().sum::<usize>() * ENTRY + l[7] * TASK
}

fn put(buf: &mut [u8], at: &mut usize, bytes: &[u8]) {
    buf[*at..*at + bytes.len()].copy_from_slice(bytes);
    *at += bytes.len();
}

fn get<const B: usize>(buf: &[u8], at: &mut usize) -> [u8; B] {
    let mut a = [0u8; B];
    a.copy_from_slice(&buf[*at..*at + B]);
    *at += B;
    a
}

/// Encodes `out` into `buf`, each entry with its request's id from `id_of` (for a scheduler `s`:
/// `|l| s.get(l.handle()).ok().map(|e| e.spec().id)`); returns the bytes written. Nothing is written
/// when it fails.
pub fn encode<const N: usize, S: Storage>(
    out: &SchedulerOutput<N, S>,
    id_of: impl Fn(Listed) -> Option<RequestId>,
    buf: &mut [u8],
) -> Result<usize, WireError> {
    let needed = encoded_len(out);
    if buf.len() < needed {
        return Err(WireError::Short {
            needed,
            got: buf.len(),
        });
    }
    if entries(out).any(|(l, _, _)| id_of(l).is_none()) {
        return Err(WireError::Stale);
    }
    let mut at = 0;
    put(buf, &mut at, &MAGIC.to_le_bytes());
    put(buf, &mut at, &VERSION.to_le_bytes());
    for n in lens(out) {
        put(buf, &mut at, &(u32_of(n)).to_le_bytes());
    }
    put(buf, &mut at, &u32::from(out.has_chunking()).to_le_bytes());
    put(buf, &mut at, &0u32.to_le_bytes()); // reserved
    for (l, tokens, last) in entries(out) {
        let id = id_of(l).map_or(0, |i| i.0);
        put(buf, &mut at, &id.to_le_bytes());
        put(buf, &mut at, &l.version().to_le_bytes());
        put(buf, &mut at, &tokens.to_le_bytes());
        put(buf, &mut at, &l.slot().to_le_bytes());
        put(buf, &mut at, &l.bucket().0.to_le_bytes());
        put(buf, &mut at, &[u8::from(last), 0, 0, 0]);
    }
    for t in out.adapters() {
        put(buf, &mut at, &t.id.0.to_le_bytes());
        put(buf, &mut at, &t.slot.0.to_le_bytes());
        put(buf, &mut at, &[0u8; 6]);
    }
    assert_eq!(at, needed, "the layout's length");
    Ok(at)
}

/// Decodes a wire buffer into `out` (which is cleared first; on error it is left cleared).
pub fn decode<const N: usize>(buf: &[u8], out: &mut WireOutput<N>) -> Result<(), WireError> {
    *out = WireOutput::default();
    if buf.len() < HEADER {
        return Err(WireError::Short {
            needed: HEADER,
            got: buf.len(),
        });
    }
    let mut at = 0;
    if u32::from_le_bytes(get(buf, &mut at)) != MAGIC
        || u32::from_le_bytes(get(buf, &mut at)) != VERSION
    {
        return Err(WireError::BadHeader);
    }
    let mut lens = [0usize; 8];
    for l in &mut lens {
        *l = u32::from_le_bytes(get(buf, &mut at)) as usize;
    }
    let flags = u32::from_le_bytes(get(buf, &mut at));
    let _reserved: [u8; 4] = get(buf, &mut at);
    let needed = HEADER + lens[..7].iter().sum::<usize>() * ENTRY + lens[7] * TASK;
    if buf.len() < needed {
        return Err(WireError::Short {
            needed,
            got: buf.len(),
        });
    }
    if lens.iter().any(|&l| l > N) {
        return Err(WireError::TooLong);
    }
    for (list, &n) in out.lists.iter_mut().zip(lens.iter()) {
        for _ in 0..n {
            let id = u64::from_le_bytes(get(buf, &mut at));
            let version = u32::from_le_bytes(get(buf, &mut at));
            let tokens = u32::from_le_bytes(get(buf, &mut at));
            let slot = u16::from_le_bytes(get(buf, &mut at));
            let task = TaskSlot(u16::from_le_bytes(get(buf, &mut at)));
            let tail: [u8; 4] = get(buf, &mut at);
            let pushed = list.push(WireEntry {
                id: RequestId(id),
                slot,
                version,
                task: (task != TaskSlot::NONE).then_some(task),
                tokens,
                last: tail[0] != 0,
            });
            assert!(pushed.is_ok(), "lengths were checked against N");
        }
    }
    for _ in 0..lens[7] {
        let id = u64::from_le_bytes(get(buf, &mut at));
        let slot = TaskSlot(u16::from_le_bytes(get(buf, &mut at)));
        let _: [u8; 6] = get(buf, &mut at);
        let pushed = out.adapters.push(TaskRef {
            id: TaskId(id),
            slot,
        });
        assert!(pushed.is_ok(), "lengths were checked against N");
    }
    out.has_chunking = flags & 1 != 0;
    Ok(())
}
