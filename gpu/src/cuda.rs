//! The CUDA backend (cudarc driver API, loaded at run time).
//!
//! Each pool is one device allocation (GPU tier) and one pinned host allocation (host tier), both
//! zeroed at creation. Page moves run on a dedicated copy stream owned by the pool: one stream per
//! device allocation, because a `CudaSlice` carries one read/write event pair and copies on
//! several streams into one allocation would serialise anyway.
//!
//! # Synchronisation of the pinned host tier
//!
//! Page copies address sub-ranges of the pinned host allocation through plain `&[u8]` slices,
//! which cudarc does not track; because the memory is page-locked the driver runs them
//! asynchronously. The store therefore keeps one invariant: **the CPU touches the host tier only
//! after synchronising the copy stream** (`read_page`, `write_page`, and `Drop` all do). Copies
//! among themselves are ordered by the single stream.

use std::sync::{Arc, OnceLock};

use cudarc::driver::{
    sys, CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DeviceRepr, PinnedHostSlice,
    ValidAsZeroBits,
};
use kvsched_core::kv::{PageMove, Tier};

use crate::copy::{copy_pieces, CopyMethod, CopyPlan};
use crate::cuda_copy::{driver_has_batched_copy, mapped_address, BatchedCopy, CopyKernel, Place};
use crate::error::MemError;
use crate::page::{
    check_len, encode_row, AdapterMemory, BlockTableShape, CopyEvent, Direction, KvMemory,
    MoveChecker, PageStore, PoolShape,
};

/// Whether the CUDA driver library (`libcuda.so` / `nvcuda.dll`) can be loaded. Checked once.
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        // SAFETY: `is_culib_present` is unsafe only because loading a shared library runs its
        // initialisers; it tries the same driver library names cudarc loads on first use, and the
        // CUDA driver is meant to be loaded into any process.
        unsafe { sys::is_culib_present() }
    })
}

/// Opens device `ordinal` (its primary context), or `NoDriver` when no driver library exists.
///
/// `CudaContext::new` panics without a driver; this checks first. With a driver but no usable
/// device (e.g. `CUDA_ERROR_NO_DEVICE`) it returns the driver error.
pub fn open_device(ordinal: usize) -> Result<Arc<CudaContext>, MemError> {
    if !driver_present() {
        return Err(MemError::NoDriver);
    }
    Ok(CudaContext::new(ordinal)?)
}

/// Element types for which every byte pattern is a valid value.
trait AnyBits: DeviceRepr + ValidAsZeroBits {}
impl AnyBits for u8 {}
impl AnyBits for i32 {}

/// Page-locked host memory of `len` elements (at least one: the driver refuses empty
/// allocations), every byte set to `fill`.
fn pinned<T: AnyBits>(
    ctx: &Arc<CudaContext>,
    len: usize,
    flags: u32,
    fill: u8,
) -> Result<PinnedHostSlice<T>, MemError> {
    let len = len.max(1);
    // SAFETY: the only unsafety is that the memory starts uninitialised; every byte is written
    // below before anything reads it. `len * size_of::<T>()` was bounded by `isize::MAX` when the
    // shape was validated, so cudarc's size assertions hold.
    let mut slice = unsafe { ctx.alloc_pinned_with_flags::<T>(len, flags) }?;
    let ptr = slice.as_mut_ptr()?;
    // SAFETY: `ptr` is the start of a fresh, aligned (cudarc asserts it) allocation of `len`
    // elements of `T` that nothing else references yet; writing bytes through a raw pointer does
    // not read the uninitialised memory, and every byte pattern is a valid `T` (`T: AnyBits`).
    unsafe { std::ptr::write_bytes(ptr, fill, len) };
    Ok(slice)
}

/// Both tiers of one pool on a CUDA device, and the means to move pages between them.
#[derive(Debug)]
struct CudaTiers {
    shape: PoolShape,
    stream: Arc<CudaStream>,
    gpu: CudaSlice<u8>,
    gpu_base: sys::CUdeviceptr,
    host: PinnedHostSlice<u8>,
    /// The host tier's device mapping (the kernel reads and writes it there).
    host_device: sys::CUdeviceptr,
    checker: MoveChecker,
    method: CopyMethod,
    /// `None` when the driver predates the batched copy (12.8).
    batched: Option<BatchedCopy>,
    /// `None` when the kernel could not be loaded.
    kernel: Option<CopyKernel>,
}

impl CudaTiers {
    fn new(ctx: &Arc<CudaContext>, shape: PoolShape) -> Result<Self, MemError> {
        shape.validate()?;
        let stream = ctx.new_stream()?;
        let gpu = stream.alloc_zeros::<u8>(shape.tier_bytes(Tier::Gpu).max(1))?;
        let gpu_base = {
            let (ptr, _record) = gpu.device_ptr(&stream);
            ptr
        };
        // Not write-combined, because the CPU reads what device-to-host copies write; mapped, so that
        // the copy kernel reaches it.
        let mut host = pinned::<u8>(
            ctx,
            shape.tier_bytes(Tier::Host),
            sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
            0,
        )?;
        let host_device = mapped_address(host.as_mut_ptr()?.cast())?;
        stream.synchronize()?;
        Ok(Self {
            shape,
            stream,
            gpu,
            gpu_base,
            host,
            host_device,
            checker: MoveChecker::new(&shape),
            method: CopyMethod::default(),
            batched: driver_has_batched_copy().then(BatchedCopy::default),
            kernel: CopyKernel::load(ctx).ok(),
        })
    }

    /// What a call runs now: the method resolved for this store (see [`CopyMethod::plan`]).
    fn plan(&self) -> CopyPlan {
        // The kernel moves 16-byte words: every piece (a page, or one layer of it) must be a multiple.
        let kernel = self.kernel.is_some() && self.shape.piece_bytes() % 16 == 0;
        // The copy engines see pieces: whole pages, or one layer of a page in a layer-major pool.
        self.method
            .plan(self.shape.piece_bytes(), self.batched.is_some(), kernel)
    }

    fn page_address(&self, page: u32) -> Result<sys::CUdeviceptr, MemError> {
        let first = self.shape.page_pieces(Tier::Gpu, page)?.next();
        // Lossless: the offset is below the allocation size, which fits isize.
        Ok(self.gpu_base + first.map_or(0, |range| range.start) as u64)
    }

    fn read(&self, tier: Tier, page: u32, out: &mut [u8]) -> Result<(), MemError> {
        check_len(self.shape.page_bytes, out.len())?;
        let pieces = self.shape.page_pieces(tier, page)?;
        let outs = out.chunks_exact_mut(self.shape.piece_bytes());
        if tier == Tier::Host {
            self.stream.synchronize()?;
        }
        for (range, out) in pieces.zip(outs) {
            match tier {
                Tier::Gpu => self.stream.memcpy_dtoh(&self.gpu.slice(range), out)?,
                Tier::Host => out.copy_from_slice(&self.host.as_slice()?[range]),
            }
        }
        // `out` may itself be pinned memory, for which a device-to-host copy is asynchronous.
        self.stream.synchronize()?;
        Ok(())
    }

    fn write(&mut self, tier: Tier, page: u32, data: &[u8]) -> Result<(), MemError> {
        check_len(self.shape.page_bytes, data.len())?;
        let pieces = self.shape.page_pieces(tier, page)?;
        let datas = data.chunks_exact(self.shape.piece_bytes());
        if tier == Tier::Host {
            self.stream.synchronize()?;
        }
        for (range, data) in pieces.zip(datas) {
            match tier {
                Tier::Gpu => self
                    .stream
                    .memcpy_htod(data, &mut self.gpu.slice_mut(range))?,
                Tier::Host => self.host.as_mut_slice()?[range].copy_from_slice(data),
            }
        }
        // `data` may be pinned memory the caller reuses as soon as we return.
        self.stream.synchronize()?;
        Ok(())
    }

    /// Enqueues the moves on the copy stream by the store's plan and records an event after them.
    fn copy(&mut self, direction: Direction, moves: &[PageMove]) -> Result<CopyEvent, MemError> {
        self.checker.check(&self.shape, direction, moves)?;
        if moves.is_empty() {
            return Ok(CopyEvent::complete());
        }
        let plan = self.plan();
        let (gpu, host) = (
            (self.gpu_base, Place::Device),
            (self.host_device, Place::Host),
        );
        let (from, to) = match direction {
            Direction::Offload => (gpu, host),
            Direction::Reload => (host, gpu),
        };
        let pieces = copy_pieces(moves, self.shape, direction.tiers().0, plan.max_piece());
        match (plan, &mut self.batched, &mut self.kernel) {
            (CopyPlan::Batched, Some(batched), _) => {
                batched.submit(&self.stream, pieces, from, to)?;
            }
            (CopyPlan::Kernel { blocks }, _, Some(kernel)) => {
                kernel.submit(&self.stream, pieces, from.0, to.0, blocks)?;
            }
            _ => {
                // One copy per piece. No CPU access happens through this slice: it only names byte
                // ranges for the driver, which orders them on `self.stream` (see the module docs).
                let host = self.host.as_mut_slice()?;
                for piece in pieces {
                    let source = piece.source..piece.source + piece.len;
                    let target = piece.target..piece.target + piece.len;
                    match direction {
                        Direction::Offload => self
                            .stream
                            .memcpy_dtoh(&self.gpu.slice(source), &mut host[target])?,
                        Direction::Reload => self
                            .stream
                            .memcpy_htod(&host[source], &mut self.gpu.slice_mut(target))?,
                    }
                }
            }
        }
        Ok(CopyEvent::recorded(self.stream.record_event(None)?))
    }

    fn synchronize(&self) -> Result<(), MemError> {
        Ok(self.stream.synchronize()?)
    }
}

impl Drop for CudaTiers {
    fn drop(&mut self) {
        // Copies into the pinned host tier may still be in flight; the pinned allocation must not
        // be freed under them. An error here cannot be reported; cudarc records it in the context.
        let _ = self.stream.synchronize();
    }
}

/// Per-request block tables: staged in pinned memory by the CPU, uploaded to a device buffer.
#[derive(Debug)]
struct CudaBlockTables {
    shape: BlockTableShape,
    stream: Arc<CudaStream>,
    staging: PinnedHostSlice<i32>,
    device: CudaSlice<i32>,
    /// The last upload, which reads `staging` asynchronously.
    upload: Option<CudaEvent>,
}

impl CudaBlockTables {
    fn new(ctx: &Arc<CudaContext>, shape: BlockTableShape) -> Result<Self, MemError> {
        shape.validate()?;
        let stream = ctx.new_stream()?;
        // Write-combined: the CPU only writes the staging table, the device only reads it.
        let staging = pinned::<i32>(
            ctx,
            shape.entries(),
            sys::CU_MEMHOSTALLOC_WRITECOMBINED,
            0xff,
        )?;
        let mut device = stream.alloc_zeros::<i32>(shape.entries().max(1))?;
        // All-ones bytes are -1 = BLOCK_TABLE_PAD in every entry.
        stream.memcpy_htod(&staging, &mut device)?;
        stream.synchronize()?;
        Ok(Self {
            shape,
            stream,
            staging,
            device,
            upload: None,
        })
    }

    fn stage(&mut self, gpu_pages: u32, row: u32, pages: &[u32]) -> Result<(), MemError> {
        self.shape.check_row(gpu_pages, row, pages)?;
        if let Some(upload) = &self.upload {
            // The previous upload must have read the staging table before we overwrite it.
            upload.synchronize()?;
        }
        let staging = self.staging.as_mut_slice()?;
        encode_row(&mut staging[self.shape.row_range(row)], pages);
        Ok(())
    }

    fn upload(&mut self, rows: u32) -> Result<CopyEvent, MemError> {
        let entries = self.shape.prefix(rows)?;
        if entries == 0 {
            return Ok(CopyEvent::complete());
        }
        let staging = self.staging.as_slice()?;
        self.stream
            .memcpy_htod(&staging[..entries], &mut self.device.slice_mut(..entries))?;
        self.upload = Some(self.stream.record_event(None)?);
        Ok(CopyEvent::recorded(self.stream.record_event(None)?))
    }

    fn read(&self, rows: u32, out: &mut [i32]) -> Result<(), MemError> {
        let entries = self.shape.prefix(rows)?;
        check_len(entries, out.len())?;
        if entries == 0 {
            return Ok(());
        }
        self.stream
            .memcpy_dtoh(&self.device.slice(..entries), out)?;
        self.stream.synchronize()?;
        Ok(())
    }
}

impl Drop for CudaBlockTables {
    fn drop(&mut self) {
        // The last upload may still read the pinned staging table (see `CudaTiers::drop`).
        let _ = self.stream.synchronize();
    }
}

/// KV cache memory on a CUDA device: one device allocation for the GPU tier, one pinned
/// (not write-combined) host allocation for the host tier, a copy stream for suspend/resume and a
/// second stream for block-table uploads.
#[derive(Debug)]
pub struct CudaKvStore {
    tiers: CudaTiers,
    tables: CudaBlockTables,
}

impl CudaKvStore {
    /// Allocates both tiers (zeroed) and the block tables (all `-1`) on `ctx`'s device.
    pub fn new(
        ctx: &Arc<CudaContext>,
        shape: PoolShape,
        tables: BlockTableShape,
    ) -> Result<Self, MemError> {
        Ok(Self {
            tiers: CudaTiers::new(ctx, shape)?,
            tables: CudaBlockTables::new(ctx, tables)?,
        })
    }

    /// The device address of GPU page `page`: `base + page * page_bytes`.
    pub fn page_address(&self, page: u32) -> Result<u64, MemError> {
        self.tiers.page_address(page)
    }

    /// The GPU tier's device allocation (for kernel launches through cudarc).
    pub fn gpu_pages(&self) -> &CudaSlice<u8> {
        &self.tiers.gpu
    }

    /// The device block table, `rows * width` `i32` entries, row-major, `-1` after a row's last page.
    ///
    /// Uploads write it on the block-table stream. Kernels launched through cudarc with this slice
    /// as an argument are ordered against uploads by cudarc's per-slice events; a kernel launched
    /// any other way must wait on the upload's [`CopyEvent`] and finish before the next upload.
    pub fn device_block_tables(&self) -> &CudaSlice<i32> {
        &self.tables.device
    }

    /// The stream page moves run on.
    pub fn copy_stream(&self) -> &Arc<CudaStream> {
        &self.tiers.stream
    }

    /// How page moves are submitted (default [`CopyMethod::AUTO`]); takes effect from the next call.
    pub fn set_copy_method(&mut self, method: CopyMethod) {
        self.tiers.method = method;
    }

    /// What a call runs now: the method resolved for this store's page size, the driver and the
    /// kernel (a method the store cannot run falls back, see [`CopyMethod::plan`]).
    pub fn copy_plan(&self) -> CopyPlan {
        self.tiers.plan()
    }
}

impl PageStore for CudaKvStore {
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
        self.tiers.synchronize()?;
        Ok(self.tables.stream.synchronize()?)
    }
}

impl KvMemory for CudaKvStore {
    fn offload(&mut self, moves: &[PageMove]) -> Result<CopyEvent, MemError> {
        self.tiers.copy(Direction::Offload, moves)
    }

    fn reload(&mut self, moves: &[PageMove]) -> Result<CopyEvent, MemError> {
        self.tiers.copy(Direction::Reload, moves)
    }

    fn copies_in_order(&self) -> bool {
        // Offloads and reloads are both enqueued on the one copy stream of `self.tiers`.
        true
    }

    fn block_table_shape(&self) -> BlockTableShape {
        self.tables.shape
    }

    fn stage_block_table(&mut self, row: u32, pages: &[u32]) -> Result<(), MemError> {
        self.tables.stage(self.tiers.shape.gpu_pages, row, pages)
    }

    fn upload_block_tables(&mut self, rows: u32) -> Result<CopyEvent, MemError> {
        self.tables.upload(rows)
    }

    fn read_block_tables(&self, rows: u32, out: &mut [i32]) -> Result<(), MemError> {
        self.tables.read(rows, out)
    }
}

/// Adapter memory on a CUDA device: device adapter pages in one device allocation, host adapter
/// pages in one pinned allocation, uploads on a dedicated copy stream.
#[derive(Debug)]
pub struct CudaAdapterStore {
    tiers: CudaTiers,
}

impl CudaAdapterStore {
    /// Allocates both tiers, zeroed, on `ctx`'s device.
    pub fn new(ctx: &Arc<CudaContext>, shape: PoolShape) -> Result<Self, MemError> {
        Ok(Self {
            tiers: CudaTiers::new(ctx, shape)?,
        })
    }

    /// The device address of device adapter page `page`: `base + page * page_bytes`.
    pub fn page_address(&self, page: u32) -> Result<u64, MemError> {
        self.tiers.page_address(page)
    }

    /// The device adapter pages' allocation (for kernel launches through cudarc).
    pub fn gpu_pages(&self) -> &CudaSlice<u8> {
        &self.tiers.gpu
    }

    /// The stream uploads run on.
    pub fn copy_stream(&self) -> &Arc<CudaStream> {
        &self.tiers.stream
    }

    /// How page moves are submitted (default [`CopyMethod::AUTO`]); takes effect from the next call.
    pub fn set_copy_method(&mut self, method: CopyMethod) {
        self.tiers.method = method;
    }

    /// What a call runs now: the method resolved for this store's page size, the driver and the
    /// kernel (a method the store cannot run falls back, see [`CopyMethod::plan`]).
    pub fn copy_plan(&self) -> CopyPlan {
        self.tiers.plan()
    }
}

impl PageStore for CudaAdapterStore {
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
        self.tiers.synchronize()
    }
}

impl AdapterMemory for CudaAdapterStore {
    fn upload_adapter(&mut self, moves: &[PageMove]) -> Result<CopyEvent, MemError> {
        self.tiers.copy(Direction::Reload, moves)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_can_move_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<CudaKvStore>();
        send_sync::<CudaAdapterStore>();
        send_sync::<crate::HostKvStore>();
        send_sync::<crate::HostAdapterStore>();
        send_sync::<CopyEvent>();
    }

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        match open_device(0) {
            Err(MemError::NoDriver) => assert!(!driver_present()),
            Err(MemError::Driver(error)) => println!("driver present, device unusable: {error}"),
            Err(other) => panic!("unexpected error {other}"),
            Ok(ctx) => println!("device 0 opened: {:?}", ctx.name()),
        }
    }
}
