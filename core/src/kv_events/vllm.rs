//! vLLM's KV event wire format (vLLM 0.33's `vllm/distributed/kv_events.py`, msgspec's MessagePack),
//! byte for byte, written into a caller's buffer with no allocation: what a KV-aware router (NVIDIA
//! Dynamo's, llm-d's) subscribes to.
//!
//! - A batch is the array `[ts, events, data_parallel_rank]` (an `array_like` struct): `ts` a
//!   float64, the rank an integer.
//! - An event is a map whose first key is `"type"` (the tagged union's tag, the class name), then its
//!   fields in declaration order, defaults omitted:
//!   - `BlockStored`: `block_hashes`, `parent_block_hash`, `token_ids`, `block_size`, `lora_id`,
//!     `medium`, `lora_name` — under a 16-bit map header (msgspec sizes the header for the struct's
//!     16 possible entries before it omits the defaults);
//!   - `BlockRemoved`: `block_hashes`, `medium`;
//!   - `AllBlocksCleared`: nothing but its tag.
//! - Integers take their shortest form, `None` is nil, strings their shortest header.
//!
//! `core/tests/kv_events_vllm.rs` and `tests/kv_events_vllm.rs` hold it to msgspec's own bytes for
//! vLLM's own structs.

use core::borrow::Borrow;

use crate::kv::Tier;

/// Where a block is (vLLM's `medium`).
pub const fn medium(tier: Tier) -> &'static str {
    match tier {
        Tier::Gpu => "GPU",
        Tier::Host => "CPU",
    }
}

/// One event in vLLM's terms ([the module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VllmEvent<'a> {
    /// `BlockStored`: consecutive blocks of one chain.
    Stored {
        /// The blocks' hashes, in chain order.
        block_hashes: &'a [u64],
        /// The first block's parent (`None` for a prompt's first block).
        parent: Option<u64>,
        /// Every block's tokens, in order (`block_size` each).
        token_ids: &'a [u32],
        /// Tokens a block.
        block_size: u32,
        /// The adapter's numeric id (vLLM's deprecated `lora_id`).
        lora_id: Option<u64>,
        /// Where the blocks are.
        tier: Tier,
        /// The adapter's served name (`None`: the base model).
        lora_name: Option<&'a str>,
    },
    /// `BlockRemoved`.
    Removed {
        /// The blocks' hashes.
        block_hashes: &'a [u64],
        /// Where they were.
        tier: Tier,
    },
    /// `AllBlocksCleared`.
    Cleared,
}

/// The buffer cannot hold the batch (nothing meaningful was written); `needed` is the batch's length
/// in bytes (`usize::MAX` when a length in it is past MessagePack's 32 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferFull {
    /// The bytes the batch takes.
    pub needed: usize,
}

/// Writes `[ts, events, data_parallel_rank]` into `out`; returns the bytes written. `events` is a
/// slice of events or any iterator that knows its length (events built as they are written).
pub fn encode_batch<'e, I>(
    out: &mut [u8],
    ts: f64,
    events: I,
    data_parallel_rank: u32,
) -> Result<usize, BufferFull>
where
    I: IntoIterator,
    I::IntoIter: ExactSizeIterator,
    I::Item: Borrow<VllmEvent<'e>>,
{
    let events = events.into_iter();
    let mut w = Writer {
        out,
        at: 0,
        full: false,
    };
    let written = w.batch(ts, events, data_parallel_rank);
    match (written, w.full) {
        (Ok(()), false) => Ok(w.at),
        (Ok(()), true) => Err(BufferFull { needed: w.at }),
        (Err(Oversize), _) => Err(BufferFull { needed: usize::MAX }),
    }
}

/// A length past MessagePack's 32 bits.
#[derive(Debug)]
struct Oversize;

/// MessagePack into a byte buffer; past its end it goes on counting (`full`), so a refusal says how
/// long the batch is.
struct Writer<'o> {
    out: &'o mut [u8],
    at: usize,
    full: bool,
}

impl Writer<'_> {
    fn batch<'e, I>(&mut self, ts: f64, events: I, rank: u32) -> Result<(), Oversize>
    where
        I: ExactSizeIterator,
        I::Item: Borrow<VllmEvent<'e>>,
    {
        self.byte(0x93)?;
        self.byte(0xcb)?;
        self.bytes(&ts.to_bits().to_be_bytes())?;
        self.array(events.len())?;
        for e in events {
            self.event(e.borrow())?;
        }
        self.uint(u64::from(rank))
    }

    fn bytes(&mut self, b: &[u8]) -> Result<(), Oversize> {
        let end = self.at.checked_add(b.len()).ok_or(Oversize)?;
        match self.out.get_mut(self.at..end) {
            Some(room) if !self.full => room.copy_from_slice(b),
            _ => self.full = true,
        }
        self.at = end;
        Ok(())
    }

    fn byte(&mut self, b: u8) -> Result<(), Oversize> {
        self.bytes(&[b])
    }

    fn uint(&mut self, v: u64) -> Result<(), Oversize> {
        let b = v.to_be_bytes();
        let (tag, from) = match v {
            0..=0x7f => return self.bytes(&b[7..]),
            0x80..=0xff => (0xcc, 7),
            0x100..=0xffff => (0xcd, 6),
            0x1_0000..=0xffff_ffff => (0xce, 4),
            _ => (0xcf, 0),
        };
        self.byte(tag)?;
        self.bytes(&b[from..])
    }

    /// A length header: `fix | len` up to 15, else `wide` and 16 bits, else `wide + 1` and 32.
    fn header(&mut self, len: usize, fix: u8, wide: u8) -> Result<(), Oversize> {
        let n = u32::try_from(len).map_err(|_| Oversize)?;
        let b = n.to_be_bytes();
        match n {
            0..=15 => self.byte(fix | b[3]),
            16..=0xffff => {
                self.byte(wide)?;
                self.bytes(&b[2..])
            }
            _ => {
                self.byte(wide + 1)?;
                self.bytes(&b)
            }
        }
    }

    fn array(&mut self, len: usize) -> Result<(), Oversize> {
        self.header(len, 0x90, 0xdc)
    }

    fn str(&mut self, s: &str) -> Result<(), Oversize> {
        let b = u32::try_from(s.len()).map_err(|_| Oversize)?.to_be_bytes();
        match s.len() {
            0..=31 => self.byte(0xa0 | b[3])?,
            32..=0xff => self.bytes(&[0xd9, b[3]])?,
            n => self.header(n, 0xa0, 0xda)?,
        }
        self.bytes(s.as_bytes())
    }

    fn nil(&mut self) -> Result<(), Oversize> {
        self.byte(0xc0)
    }

    fn opt_uint(&mut self, v: Option<u64>) -> Result<(), Oversize> {
        match v {
            Some(v) => self.uint(v),
            None => self.nil(),
        }
    }

    fn key(&mut self, k: &str) -> Result<(), Oversize> {
        self.str(k)
    }

    fn hashes(&mut self, h: &[u64]) -> Result<(), Oversize> {
        self.key("block_hashes")?;
        self.array(h.len())?;
        h.iter().try_for_each(|&x| self.uint(x))
    }

    fn event(&mut self, e: &VllmEvent<'_>) -> Result<(), Oversize> {
        match *e {
            VllmEvent::Stored {
                block_hashes,
                parent,
                token_ids,
                block_size,
                lora_id,
                tier,
                lora_name,
            } => {
                self.bytes(&[0xde, 0, 8])?;
                self.key("type")?;
                self.str("BlockStored")?;
                self.hashes(block_hashes)?;
                self.key("parent_block_hash")?;
                self.opt_uint(parent)?;
                self.key("token_ids")?;
                self.array(token_ids.len())?;
                token_ids
                    .iter()
                    .try_for_each(|&t| self.uint(u64::from(t)))?;
                self.key("block_size")?;
                self.uint(u64::from(block_size))?;
                self.key("lora_id")?;
                self.opt_uint(lora_id)?;
                self.key("medium")?;
                self.str(medium(tier))?;
                self.key("lora_name")?;
                match lora_name {
                    Some(n) => self.str(n),
                    None => self.nil(),
                }
            }
            VllmEvent::Removed { block_hashes, tier } => {
                self.byte(0x83)?;
                self.key("type")?;
                self.str("BlockRemoved")?;
                self.hashes(block_hashes)?;
                self.key("medium")?;
                self.str(medium(tier))
            }
            VllmEvent::Cleared => {
                self.byte(0x81)?;
                self.key("type")?;
                self.str("AllBlocksCleared")
            }
        }
    }
}
