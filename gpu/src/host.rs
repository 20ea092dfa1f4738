//! The host-memory backend: both tiers are `Vec<u8>`, copies are synchronous `copy_from_slice`.
//!
//! Same page math, same validation and same block-table staging as the CUDA backend, so CI and the
//! simulator exercise the logic without a GPU.

use kvsched_core::kv::{PageMove, Tier};

use crate::copy::copy_pieces;
use crate::error::MemError;
use crate::page::{
    check_len, encode_row, AdapterMemory, BlockTableShape, CopyEvent, Direction, KvMemory,
    MoveChecker, PageStore, PoolShape, BLOCK_TABLE_PAD,
};

/// A zero-filled vector of `len` elements, or `HostAllocation` instead of aborting.
fn filled<T: Copy>(len: usize, value: T) -> Result<Vec<T>, MemError> {
    let mut vec = Vec::new();
    let bytes = len.saturating_mul(core::mem::size_of::<T>());
    vec.try_reserve_exact(len)
        .map_err(|_| MemError::HostAllocation { bytes })?;
    vec.resize(len, value);
    Ok(vec)
}

/// Both tiers of one pool in host memory.
#[derive(Debug)]
struct HostTiers {
    shape: PoolShape,
    gpu: Vec<u8>,
    host: Vec<u8>,
    checker: MoveChecker,
}

impl HostTiers {
    fn new(shape: PoolShape) -> Result<Self, MemError> {
        shape.validate()?;
        Ok(Self {
            gpu: filled(shape.tier_bytes(Tier::Gpu), 0)?,
            host: filled(shape.tier_bytes(Tier::Host), 0)?,
            checker: MoveChecker::new(&shape),
            shape,
        })
    }

    fn read(&self, tier: Tier, page: u32, out: &mut [u8]) -> Result<(), MemError> {
        check_len(self.shape.page_bytes, out.len())?;
        let memory = match tier {
            Tier::Gpu => &self.gpu,
            Tier::Host => &self.host,
        };
        let pieces = self.shape.page_pieces(tier, page)?;
        for (range, out) in pieces.zip(out.chunks_exact_mut(self.shape.piece_bytes())) {
            out.copy_from_slice(&memory[range]);
        }
        Ok(())
    }

    fn write(&mut self, tier: Tier, page: u32, data: &[u8]) -> Result<(), MemError> {
        check_len(self.shape.page_bytes, data.len())?;
        let memory = match tier {
            Tier::Gpu => &mut self.gpu,
            Tier::Host => &mut self.host,
        };
        let pieces = self.shape.page_pieces(tier, page)?;
        for (range, data) in pieces.zip(data.chunks_exact(self.shape.piece_bytes())) {
            memory[range].copy_from_slice(data);
        }
        Ok(())
    }

    fn copy(&mut self, direction: Direction, moves: &[PageMove]) -> Result<CopyEvent, MemError> {
        self.checker.check(&self.shape, direction, moves)?;
        let (source, target) = match direction {
            Direction::Offload => (&self.gpu, &mut self.host),
            Direction::Reload => (&self.host, &mut self.gpu),
        };
        for piece in copy_pieces(moves, self.shape, direction.tiers().0, usize::MAX) {
            target[piece.target..piece.target + piece.len]
                .copy_from_slice(&source[piece.source..piece.source + piece.len]);
        }
        Ok(CopyEvent::complete())
    }
}

/// KV cache memory in plain host memory: a GPU tier and a host tier of `Vec<u8>`, plus a staging
/// and a "device" block table of `Vec<i32>`.
#[derive(Debug)]
pub struct HostKvStore {
    tiers: HostTiers,
    tables: BlockTableShape,
    staging: Vec<i32>,
    device_tables: Vec<i32>,
}

impl HostKvStore {
    /// Allocates both tiers (zeroed) and the block tables (all [`BLOCK_TABLE_PAD`]).
    pub fn new(shape: PoolShape, tables: BlockTableShape) -> Result<Self, MemError> {
        tables.validate()?;
        Ok(Self {
            tiers: HostTiers::new(shape)?,
            tables,
            staging: filled(tables.entries(), BLOCK_TABLE_PAD)?,
            device_tables: filled(tables.entries(), BLOCK_TABLE_PAD)?,
        })
    }

    /// The whole memory of `tier` (page `p` at `p * page_bytes`).
    pub fn tier_memory(&self, tier: Tier) -> &[u8] {
        match tier {
            Tier::Gpu => &self.tiers.gpu,
            Tier::Host => &self.tiers.host,
        }
    }
}

impl PageStore for HostKvStore {
    fn shape(&self) -> PoolShape {
        self.tiers.shape
    }

    fn read_page(&self, tier: Tier, page: u32, out: &mut [u8]) -> Result<(), MemError> {
        self.tiers.read(tier, page, out)
    }

    fn write_page(&mut self, tier: Tier, page: u32, data: &[u8]) -> Result<(), MemError> {
        self.tiers.write(tier, page, data)
    }

    fn synchronize(&self) -> Result<(), MemError> {
        Ok(())
    }
}

impl KvMemory for HostKvStore {
    fn offload(&mut self, moves: &[PageMove]) -> Result<CopyEvent, MemError> {
        self.tiers.copy(Direction::Offload, moves)
    }

    fn reload(&mut self, moves: &[PageMove]) -> Result<CopyEvent, MemError> {
        self.tiers.copy(Direction::Reload, moves)
    }

    fn copies_in_order(&self) -> bool {
        // Every copy is done before `offload` / `reload` returns.
        true
    }

    fn block_table_shape(&self) -> BlockTableShape {
        self.tables
    }

    fn stage_block_table(&mut self, row: u32, pages: &[u32]) -> Result<(), MemError> {
        self.tables
            .check_row(self.tiers.shape.gpu_pages, row, pages)?;
        encode_row(&mut self.staging[self.tables.row_range(row)], pages);
        Ok(())
    }

    fn upload_block_tables(&mut self, rows: u32) -> Result<CopyEvent, MemError> {
        let entries = self.tables.prefix(rows)?;
        self.device_tables[..entries].copy_from_slice(&self.staging[..entries]);
        Ok(CopyEvent::complete())
    }

    fn read_block_tables(&self, rows: u32, out: &mut [i32]) -> Result<(), MemError> {
        let entries = self.tables.prefix(rows)?;
        check_len(entries, out.len())?;
        out.copy_from_slice(&self.device_tables[..entries]);
        Ok(())
    }
}

/// Adapter memory in plain host memory: device adapter pages and host adapter pages of `Vec<u8>`.
#[derive(Debug)]
pub struct HostAdapterStore {
    tiers: HostTiers,
}

impl HostAdapterStore {
    /// Allocates both tiers, zeroed.
    pub fn new(shape: PoolShape) -> Result<Self, MemError> {
        Ok(Self {
            tiers: HostTiers::new(shape)?,
        })
    }
}

impl PageStore for HostAdapterStore {
    fn shape(&self) -> PoolShape {
        self.tiers.shape
    }

    fn read_page(&self, tier: Tier, page: u32, out: &mut [u8]) -> Result<(), MemError> {
        self.tiers.read(tier, page, out)
    }

    fn write_page(&mut self, tier: Tier, page: u32, data: &[u8]) -> Result<(), MemError> {
        self.tiers.write(tier, page, data)
    }

    fn synchronize(&self) -> Result<(), MemError> {
        Ok(())
    }
}

impl AdapterMemory for HostAdapterStore {
    fn upload_adapter(&mut self, moves: &[PageMove]) -> Result<CopyEvent, MemError> {
        self.tiers.copy(Direction::Reload, moves)
    }
}
