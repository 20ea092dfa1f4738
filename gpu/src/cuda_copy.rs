//! The CUDA submitters of a [`CopyPlan`](crate::copy::CopyPlan) beyond one copy per run: the driver's
//! batched copy and the gather/scatter kernel (`kernel/copy_pages.ptx`, embedded, loaded through the
//! driver: nothing compiles at run time but the driver's own JIT of the PTX for the device).
//!
//! Both take [`CopyPiece`]s with byte offsets into a source and a target tier and the tiers' base
//! addresses in the device's unified address space (the GPU tier's device pointer, the pinned host
//! tier's device mapping). Both enqueue on the store's copy stream, so they are ordered with every
//! other copy of the store: a kernel copy and a copy-engine copy of one page never overlap.

use std::ffi::{c_void, CString};
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream, PinnedHostSlice};

use crate::copy::CopyPiece;
use crate::error::MemError;

/// The kernel's PTX (`scripts/gen-ptx.sh` regenerates it from `kernel/copy_pages.ll`).
pub(crate) const COPY_PTX: &str = include_str!("kernel/copy_pages.ptx");
const KERNEL_NAME: &str = "kvsched_copy_pieces";
/// Threads per kernel block (what the measurements used).
const THREADS: u32 = 1024;
/// Pieces per kernel launch or batched call; longer lists are submitted in several.
const CHUNK: usize = 16384;

/// Whether the driver has `cuMemcpyBatchAsync` (driver API 12.8, version 12080, and later).
pub(crate) fn driver_has_batched_copy() -> bool {
    let mut version = 0;
    // SAFETY: writes one int through a valid pointer; only called once a driver is loaded (a store
    // exists, so `open_device` succeeded).
    let ok = unsafe { sys::cuDriverGetVersion(&raw mut version) }.result();
    ok.is_ok() && version >= 12080
}

/// Where a tier lives, for the batched copy's location hints.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Place {
    /// Device memory of the store's device.
    Device,
    /// Pinned host memory.
    Host,
}

/// One batched driver call per [`CHUNK`] pieces, its argument arrays kept between calls.
#[derive(Debug, Default)]
pub(crate) struct BatchedCopy {
    sources: Vec<sys::CUdeviceptr>,
    targets: Vec<sys::CUdeviceptr>,
    sizes: Vec<usize>,
}

impl BatchedCopy {
    /// Enqueues the pieces (`from` → `to`, base addresses in the unified address space) on `stream`.
    pub(crate) fn submit(
        &mut self,
        stream: &CudaStream,
        pieces: impl Iterator<Item = CopyPiece>,
        from: (sys::CUdeviceptr, Place),
        to: (sys::CUdeviceptr, Place),
    ) -> Result<(), MemError> {
        let location = |place| match place {
            Place::Device => sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: stream.context().ordinal() as i32,
            },
            Place::Host => sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
                id: 0,
            },
        };
        let mut attributes = sys::CUmemcpyAttributes {
            // Sources are read in stream order: a page an earlier call writes is read after it.
            srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
            srcLocHint: location(from.1),
            dstLocHint: location(to.1),
            flags: 0,
        };
        let mut pieces = pieces.peekable();
        while pieces.peek().is_some() {
            self.sources.clear();
            self.targets.clear();
            self.sizes.clear();
            for piece in pieces.by_ref().take(CHUNK) {
                self.sources.push(from.0 + piece.source as u64);
                self.targets.push(to.0 + piece.target as u64);
                self.sizes.push(piece.len);
            }
            let (mut first, mut failed) = (0usize, usize::MAX);
            stream.context().bind_to_thread()?;
            // SAFETY: the three arrays hold `len` entries each and outlive the call (the driver reads
            // them during it); one attribute applies to every copy (index 0 from copy 0 on); the
            // addresses are inside the store's two allocations, which the store keeps alive and
            // synchronises before freeing (`CudaTiers::drop`); the stream is the store's own.
            unsafe {
                sys::cuMemcpyBatchAsync(
                    self.targets.as_mut_ptr(),
                    self.sources.as_mut_ptr(),
                    self.sizes.as_mut_ptr(),
                    self.sizes.len(),
                    &raw mut attributes,
                    &raw mut first,
                    1,
                    &raw mut failed,
                    stream.cu_stream(),
                )
            }
            .result()?;
        }
        Ok(())
    }
}

/// The gather/scatter kernel, loaded once per store, and its descriptor buffer: pinned, mapped host
/// memory in two halves that launches alternate between, each reused only after the launch that read
/// it finished.
#[derive(Debug)]
pub(crate) struct CopyKernel {
    ctx: Arc<CudaContext>,
    module: sys::CUmodule,
    function: sys::CUfunction,
    descriptors: PinnedHostSlice<u64>,
    /// Device address of `descriptors`.
    descriptors_device: sys::CUdeviceptr,
    /// The last launch that read each half.
    reads: [Option<CudaEvent>; 2],
    next: usize,
}

// SAFETY: the module and function handles are plain driver handles, usable from any thread once the
// context is bound (every use binds it first); the rest is Send + Sync cudarc types.
unsafe impl Send for CopyKernel {}
// SAFETY: as above; `&self` methods do not touch the handles.
unsafe impl Sync for CopyKernel {}

impl CopyKernel {
    /// Loads the kernel into `ctx` (the driver compiles the PTX for the device).
    pub(crate) fn load(ctx: &Arc<CudaContext>) -> Result<Self, MemError> {
        ctx.bind_to_thread()?;
        let ptx = CString::new(COPY_PTX).expect("the PTX has no NUL byte");
        let name = CString::new(KERNEL_NAME).expect("the name has no NUL byte");
        let mut module = std::ptr::null_mut();
        // SAFETY: `ptx` is a NUL-terminated PTX text, which the driver reads during the call.
        unsafe { sys::cuModuleLoadData(&raw mut module, ptx.as_ptr().cast()) }.result()?;
        let mut function = std::ptr::null_mut();
        // SAFETY: `module` was just loaded; `name` is NUL-terminated.
        let found = unsafe { sys::cuModuleGetFunction(&raw mut function, module, name.as_ptr()) };
        if let Err(e) = found.result() {
            // SAFETY: the module was loaded above and nothing else refers to it.
            let _ = unsafe { sys::cuModuleUnload(module) };
            return Err(e.into());
        }
        let words = 2 * CHUNK * 3;
        // SAFETY: the memory starts uninitialised; the kernel reads only the words the CPU wrote for
        // its launch, and the CPU writes only through `as_mut_slice` after the half's last reader
        // finished.
        let mut descriptors = unsafe {
            ctx.alloc_pinned_with_flags::<u64>(
                words,
                sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
            )
        }?;
        let descriptors_device = mapped_address(descriptors.as_mut_ptr()?.cast())?;
        Ok(Self {
            ctx: ctx.clone(),
            module,
            function,
            descriptors,
            descriptors_device,
            reads: [None, None],
            next: 0,
        })
    }

    /// Enqueues the pieces (`from` → `to`, base addresses in the unified address space, every address
    /// and length a multiple of 16) on `stream`, [`CHUNK`] pieces a launch on `blocks` blocks.
    pub(crate) fn submit(
        &mut self,
        stream: &CudaStream,
        pieces: impl Iterator<Item = CopyPiece>,
        from: sys::CUdeviceptr,
        to: sys::CUdeviceptr,
        blocks: u32,
    ) -> Result<(), MemError> {
        let mut pieces = pieces.peekable();
        while pieces.peek().is_some() {
            let half = self.next;
            self.next ^= 1;
            if let Some(read) = self.reads[half].take() {
                read.synchronize()?;
            }
            let words =
                &mut self.descriptors.as_mut_slice()?[half * CHUNK * 3..(half + 1) * CHUNK * 3];
            let mut n = 0usize;
            for (slot, piece) in words.chunks_exact_mut(3).zip(pieces.by_ref().take(CHUNK)) {
                debug_assert!(
                    piece.len % 16 == 0 && piece.source % 16 == 0 && piece.target % 16 == 0
                );
                slot[0] = from + piece.source as u64;
                slot[1] = to + piece.target as u64;
                slot[2] = piece.len as u64;
                n += 1;
            }
            let mut table = self.descriptors_device + (half * CHUNK * 3 * 8) as u64;
            let mut count = n as u64;
            let mut params = [
                (&raw mut table).cast::<c_void>(),
                (&raw mut count).cast::<c_void>(),
            ];
            self.ctx.bind_to_thread()?;
            // SAFETY: the kernel takes (u64 table address, u64 count), which `params` points at for the
            // duration of the call (the driver copies parameter values at launch); the table half holds
            // `count` descriptors written above, and stays untouched until the event recorded below
            // completes; every address is inside the store's two allocations (see `BatchedCopy`).
            unsafe {
                sys::cuLaunchKernel(
                    self.function,
                    blocks.max(1),
                    1,
                    1,
                    THREADS,
                    1,
                    1,
                    0,
                    stream.cu_stream(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            }
            .result()?;
            self.reads[half] = Some(stream.record_event(None)?);
        }
        Ok(())
    }
}

impl Drop for CopyKernel {
    fn drop(&mut self) {
        // Launches may still read the descriptors; the pinned memory is freed after this.
        for read in self.reads.iter().flatten() {
            let _ = read.synchronize();
        }
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the module was loaded by `load` and no launch of it is pending (waited above).
            let _ = unsafe { sys::cuModuleUnload(self.module) };
        }
    }
}

/// The device address of mapped pinned host memory at `host` (allocated with
/// `CU_MEMHOSTALLOC_DEVICEMAP`).
pub(crate) fn mapped_address(host: *mut c_void) -> Result<sys::CUdeviceptr, MemError> {
    let mut device = 0;
    // SAFETY: `host` is the start of a live pinned allocation made with the device-map flag; the call
    // writes one device pointer.
    unsafe { sys::cuMemHostGetDevicePointer_v2(&raw mut device, host, 0) }.result()?;
    Ok(device)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The embedded PTX names the kernel with its two 64-bit parameters (table address, count).
    #[test]
    fn the_ptx_declares_the_kernel_the_launch_passes() {
        let entry = COPY_PTX
            .split(".visible .entry ")
            .nth(1)
            .expect("an entry point");
        assert!(entry.starts_with(&format!("{KERNEL_NAME}(")), "{entry}");
        let params = entry.split(')').next().unwrap();
        assert_eq!(params.matches(".param .u64").count(), 2, "{params}");
        assert!(COPY_PTX.contains(".address_size 64"));
    }

    /// The checked-in PTX is what `kernel/copy_pages.ll` compiles to (`scripts/gen-ptx.sh`), where
    /// LLVM's `llc` is installed.
    #[test]
    fn the_checked_in_ptx_is_what_the_ir_compiles_to() {
        // The IR goes in on stdin, read at compile time: no source path is baked into the test (a
        // build folder shared between checkouts would point it at another one).
        let ir = include_str!("kernel/copy_pages.ll");
        let out = std::process::Command::new("llc")
            .args([
                "-O3",
                "-march=nvptx64",
                "-mcpu=sm_70",
                "-mattr=+ptx64",
                "-",
                "-o",
                "-",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write as _;
                child
                    .stdin
                    .take()
                    .expect("a piped stdin")
                    .write_all(ir.as_bytes())?;
                child.wait_with_output()
            });
        match out {
            Ok(out) if out.status.success() => {
                let ptx = String::from_utf8(out.stdout).unwrap();
                assert_eq!(
                    ptx.trim_end(),
                    COPY_PTX.trim_end(),
                    "stale PTX: run scripts/gen-ptx.sh"
                );
            }
            Ok(out) => panic!("llc failed: {}", String::from_utf8_lossy(&out.stderr)),
            // Not "skipped:": the device check counts those as CUDA tests that did not run.
            Err(e) => println!("llc not found ({e}): the PTX comparison did not run"),
        }
    }
}
