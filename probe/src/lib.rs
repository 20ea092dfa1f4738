//! no_std probe: uses the scheduler core with no allocator and no std. If kvsched-core (or a dependency)
//! pulled in `std` or `alloc`, this crate would fail to build (duplicate panic handler / missing
//! `#[global_allocator]`).
#![no_std]
#![forbid(unsafe_code)]

use kvsched_core::adapter::NoPeft;
use kvsched_core::output::SchedulerOutput;
use kvsched_core::kv::PageMove;
use kvsched_core::page_pool::{KvPool, KvPoolConfig, KvStorage, Seq};
use kvsched_core::request::RequestSpec;
use kvsched_core::{Config, Scheduler};

#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}

/// Runs one scheduling pass over stack buffers; returns the number of scheduled generation steps.
pub fn kvsched_probe() -> u32 {
    let cfg = KvPoolConfig { tokens_per_block: 16, gpu_pages: 64, host_pages: 0, slots: 8, max_blocks: 8 };
    let mut gpu = [0u32; 64];
    let mut tables = [0u32; 64];
    let mut seqs = [Seq::default(); 8];
    let mut moves = [PageMove::default(); 64];
    let Ok(kv) = KvPool::new(
        cfg,
        KvStorage { gpu_free: &mut gpu, host_free: &mut [], tables: &mut tables, seqs: &mut seqs, moves: &mut moves , prefix: None},
    ) else {
        return 0;
    };
    let Ok(mut s) = Scheduler::<_, _, 8, 1>::new(Config::default(), kv, NoPeft) else { return 0 };
    let _ = s.submit(RequestSpec::new(1, kvsched_core::Phase::ContextInit, 32));
    let mut out: SchedulerOutput<8> = SchedulerOutput::new();
    if s.schedule(&mut out).is_err() {
        return 0;
    }
    out.context().len() as u32
}
