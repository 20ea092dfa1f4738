//! The plain-old-data wire form of a [`SchedulerOutput`]: a fixed little-endian byte layout that can be
//! broadcast to tensor/pipeline-parallel ranks as bytes, without serialization libraries.
//!
//! Layout: a 48-byte header (`magic`, `version`, eight list lengths as `u32`, a flags word, a reserved word) followed by
//! the entries of the seven request lists in order (context, generation, encoder, paused,
//! recompute-paused, disagg, resumed), 32 bytes each (`id: u64`, `key: u64`, `chunk: u32`, `slot: u16`,
//! `bucket: u16`, `last: u8`, `lora: u8`, 6 bytes zero), then the adapter plan, 16 bytes per task (`id: u64`,
//! `slot: u16`, 6 bytes zero).

use crate::adapter::TaskRef;
use crate::output::{List, Listed, SchedulerOutput};
use crate::request::{RequestId, TaskId};

/// `"KVSO"` little-endian.
pub const MAGIC: u32 = 0x4f53_564b;
/// Layout version.
pub const VERSION: u32 = 1;
const HEADER: usize = 48;
const ENTRY: usize = 32;
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
}

impl core::fmt::Display for WireError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Short { needed, got } => {
                write!(f, "wire buffer too short: need {needed} bytes, got {got}")
            }
            Self::BadHeader => f.write_str("not a kvsched scheduler output of this version"),
            Self::TooLong => f.write_str("a list is longer than the receiving output's capacity"),
        }
    }
}

impl core::error::Error for WireError {}

fn lists<const N: usize>(o: &SchedulerOutput<N>) -> [&List<N>; 7] {
    [
        &o.context,
        &o.generation,
        &o.encoder,
        &o.paused,
        &o.recompute_paused,
        &o.disagg,
        &o.resumed,
    ]
}

/// Bytes the wire form of `out` takes.
pub fn encoded_len<const N: usize>(out: &SchedulerOutput<N>) -> usize {
    HEADER + lists(out).iter().map(|l| l.len()).sum::<usize>() * ENTRY + out.adapters.len() * TASK
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

/// Encodes `out` into `buf`; returns the bytes written.
pub fn encode<const N: usize>(
    out: &SchedulerOutput<N>,
    buf: &mut [u8],
) -> Result<usize, WireError> {
    let needed = encoded_len(out);
    if buf.len() < needed {
        return Err(WireError::Short {
            needed,
            got: buf.len(),
        });
    }
    let mut at = 0;
    put(buf, &mut at, &MAGIC.to_le_bytes());
    put(buf, &mut at, &VERSION.to_le_bytes());
    for l in lists(out) {
        put(buf, &mut at, &(l.len() as u32).to_le_bytes());
    }
    put(buf, &mut at, &(out.adapters.len() as u32).to_le_bytes());
    put(buf, &mut at, &(out.has_chunking as u32).to_le_bytes());
    put(buf, &mut at, &0u32.to_le_bytes()); // reserved
    for l in lists(out) {
        for e in l.iter() {
            put(buf, &mut at, &e.id.0.to_le_bytes());
            put(buf, &mut at, &e.key.to_le_bytes());
            put(buf, &mut at, &e.chunk.to_le_bytes());
            put(buf, &mut at, &e.slot.to_le_bytes());
            put(buf, &mut at, &e.bucket.to_le_bytes());
            put(
                buf,
                &mut at,
                &[e.last as u8, e.lora as u8, 0, 0, 0, 0, 0, 0],
            );
        }
    }
    for t in out.adapters.iter() {
        put(buf, &mut at, &t.id.0.to_le_bytes());
        put(buf, &mut at, &t.slot.to_le_bytes());
        put(buf, &mut at, &[0u8; 6]);
    }
    debug_assert_eq!(at, needed);
    Ok(at)
}

/// Decodes a wire buffer into `out` (which is cleared first; on error it is left cleared).
pub fn decode<const N: usize>(buf: &[u8], out: &mut SchedulerOutput<N>) -> Result<(), WireError> {
    out.clear();
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
    for l in lens.iter_mut() {
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
    let read_list = |list: &mut List<N>, n: usize, at: &mut usize| {
        for _ in 0..n {
            let id = u64::from_le_bytes(get(buf, at));
            let key = u64::from_le_bytes(get(buf, at));
            let chunk = u32::from_le_bytes(get(buf, at));
            let slot = u16::from_le_bytes(get(buf, at));
            let bucket = u16::from_le_bytes(get(buf, at));
            let tail: [u8; 8] = get(buf, at);
            let _ = list.push(Listed {
                id: RequestId(id),
                slot,
                chunk,
                last: tail[0] != 0,
                key,
                lora: tail[1] != 0,
                bucket,
            });
        }
    };
    read_list(&mut out.context, lens[0], &mut at);
    read_list(&mut out.generation, lens[1], &mut at);
    read_list(&mut out.encoder, lens[2], &mut at);
    read_list(&mut out.paused, lens[3], &mut at);
    read_list(&mut out.recompute_paused, lens[4], &mut at);
    read_list(&mut out.disagg, lens[5], &mut at);
    read_list(&mut out.resumed, lens[6], &mut at);
    for _ in 0..lens[7] {
        let id = u64::from_le_bytes(get(buf, &mut at));
        let slot = u16::from_le_bytes(get(buf, &mut at));
        let _: [u8; 6] = get(buf, &mut at);
        let _ = out.adapters.push(TaskRef {
            id: TaskId(id),
            slot,
        });
    }
    out.has_chunking = flags & 1 != 0;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bad_input() {
        let mut o: SchedulerOutput<8> = SchedulerOutput::new();
        o.context
            .push(Listed {
                id: RequestId(7),
                slot: 3,
                chunk: 128,
                last: false,
                key: u64::MAX,
                lora: true,
                bucket: 1,
            })
            .unwrap();
        o.generation
            .push(Listed {
                id: RequestId(1),
                slot: 0,
                chunk: 0,
                last: false,
                key: 0,
                lora: false,
                bucket: u16::MAX,
            })
            .unwrap();
        o.paused
            .push(Listed {
                id: RequestId(9),
                ..Listed::default()
            })
            .unwrap();
        o.recompute_paused
            .push(Listed {
                id: RequestId(4),
                last: true,
                ..Listed::default()
            })
            .unwrap();
        o.adapters
            .push(TaskRef {
                id: TaskId(4),
                slot: 1,
            })
            .unwrap();
        o.has_chunking = true;
        let mut buf = [0u8; 512];
        let n = encode(&o, &mut buf).unwrap();
        assert_eq!(n, encoded_len(&o));
        let mut back: SchedulerOutput<8> = SchedulerOutput::new();
        decode(&buf[..n], &mut back).unwrap();
        assert_eq!(back.context, o.context);
        assert_eq!(back.generation, o.generation);
        assert_eq!(back.paused, o.paused);
        assert_eq!(back.recompute_paused, o.recompute_paused);
        assert_eq!(back.adapters, o.adapters);
        assert!(back.has_chunking);
        assert!(matches!(
            decode(&buf[..n - 1], &mut back),
            Err(WireError::Short { .. })
        ));
        assert!(matches!(
            encode(&o, &mut buf[..10]),
            Err(WireError::Short { .. })
        ));
        buf[0] ^= 1;
        assert_eq!(decode(&buf[..n], &mut back), Err(WireError::BadHeader));
        let mut small: SchedulerOutput<1> = SchedulerOutput::new();
        buf[0] ^= 1;
        let mut two: SchedulerOutput<8> = SchedulerOutput::new();
        two.generation.push(Listed::default()).unwrap();
        two.generation.push(Listed::default()).unwrap();
        let n = encode(&two, &mut buf).unwrap();
        assert_eq!(decode(&buf[..n], &mut small), Err(WireError::TooLong));
    }
}
