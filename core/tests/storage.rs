//! Where a scheduler may live (the crate docs' "Where a scheduler lives"): the sizes of the common
//! instantiations, inline and boxed, pinned on 64-bit; a scheduler and its output built in a `static`
//! by the const constructors; a boxed scheduler and output that behave exactly as inline ones.

use std::mem::size_of;
use std::sync::Mutex;

use kvsched_core::adapter::{AdapterHold, PeftBackend, TaskRef};
use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::error::PeftError;
use kvsched_core::ids::{RequestId, TaskId};
use kvsched_core::kv::{Absent, CacheState, ContextPrep, KvBackend, KvLimits, KvRef, PageMove};
use kvsched_core::kv_set::KvSet;
use kvsched_core::page_pool::{KvPool, KvPoolConfig};
use kvsched_core::storage::{Boxed, Inline, Owned, Storage};
use kvsched_core::{Config, NoPeft, Phase, RequestSpec, Scheduler, SchedulerOutput};

/// A backend of one pointer that holds nothing, the size of the conformance runner's scripted ones
/// (an `Rc` each): no request ever gets pages, no adapter is known.
#[derive(Debug, Clone, Copy)]
struct Null(#[allow(dead_code)] &'static ());

const NULL: Null = Null(&());

impl KvBackend for Null {
    type Draft = Absent;
    type Cross = Absent;
    type Transfers = Absent;
    type Prefix = Absent;
    type Adapters = Absent;

    fn limits(&self) -> KvLimits {
        KvLimits {
            tier_below_gpu: false,
            can_evict: false,
            max_tokens_per_request: u64::from(u32::MAX),
            slots: u32::MAX,
            sliding_windows: false,
            reserves: false,
        }
    }
    fn cache(&self, _: KvRef) -> CacheState {
        CacheState::NoCache
    }
    fn prepare_context(&mut self, _: KvRef, _: ContextPrep) -> Option<u32> {
        None
    }
    fn prepare_disagg_gen_init(&mut self, _: KvRef, _: u32) -> bool {
        false
    }
    fn resize_context(&mut self, _: KvRef, _: u32, _: bool) -> bool {
        false
    }
    fn try_allocate_generation(&mut self, _: KvRef, _: u32) -> bool {
        false
    }
    fn revert_allocate_generation(&mut self, _: KvRef) {}
    fn rewind(&mut self, _: KvRef, _: u32) {}
    fn suspend(&mut self, _: KvRef) {}
    fn free(&mut self, _: KvRef) {}
    fn preempt(&mut self, _: KvRef) {}
    fn take_moves(&mut self) -> &[PageMove] {
        &[]
    }
}

impl PeftBackend for Null {
    fn max_device_pages(&self) -> u32 {
        u32::MAX
    }
    fn lookup(&self, _: TaskId) -> Option<TaskRef> {
        None
    }
    fn determine_num_pages(&mut self, _: RequestId, _: TaskRef) -> u32 {
        0
    }
    fn add_request(&mut self, _: RequestId, _: TaskRef, _: bool) -> Result<(), PeftError> {
        Ok(())
    }
    fn mark_request_done(&mut self, _: RequestId, _: TaskRef, _: bool, _: AdapterHold) {}
    fn ensure_batch(&mut self, _: &[TaskRef], _: &mut dyn FnMut(TaskRef)) -> Result<(), PeftError> {
        Ok(())
    }
}

/// A pool that owns its buffers.
type Pool = KvPool<'static, Owned>;
/// The C engine's scheduler (`capi/src/engine.rs` holds the boxed one).
type Engine<S> = Scheduler<Pool, AdapterPool<64>, 1024, 64, S>;
/// The bench's S1-256 (`src/bench.rs`).
type S1_256<S> = Scheduler<KvSet<Pool>, AdapterPool<8>, 256, 8, S>;
/// The conformance runner's (`src/conformance`: three scripted pools, a scripted adapter cache).
type Runner<S> = Scheduler<KvSet<Null, Null, Null>, Null, 1024, 256, S>;
/// The simulator's (`src/sim`).
type Sim<S> = Scheduler<KvSet<Pool>, AdapterPool<1024>, 1024, 1024, S>;

/// A release build's inline size of a scheduler of `n` requests, in this build: a debug build with
/// `std` arms a drop bomb in every request (`core/src/bomb.rs`), 8 bytes more a table entry.
const fn with_bombs(release: usize, n: usize) -> usize {
    if cfg!(debug_assertions) {
        release + 8 * n
    } else {
        release
    }
}

#[test]
#[cfg(target_pointer_width = "64")]
fn the_sizes_are_pinned() {
    // Inline: the arrays inside the value (the default type parameters, unchanged by the storage
    // parameter).
    assert_eq!(size_of::<Engine<Inline>>(), with_bombs(465_848, 1024));
    assert_eq!(
        size_of::<Scheduler<Pool, AdapterPool<64>, 1024, 64>>(),
        with_bombs(465_848, 1024)
    );
    assert_eq!(size_of::<S1_256<Inline>>(), with_bombs(117_776, 256));
    assert_eq!(size_of::<Runner<Inline>>(), with_bombs(467_792, 1024));
    assert_eq!(size_of::<Sim<Inline>>(), with_bombs(555_312, 1024));
    assert_eq!(size_of::<SchedulerOutput<1024>>(), 98_392);
    // Boxed: a pointer an array; what is left is the configuration, the counters and the backends
    // (the engine's adapter cache is 3,864 bytes, the simulator's 60,504).
    assert_eq!(size_of::<Engine<Boxed>>(), 5_256);
    assert_eq!(size_of::<S1_256<Boxed>>(), 3_096);
    assert_eq!(size_of::<Runner<Boxed>>(), 864);
    assert_eq!(size_of::<Sim<Boxed>>(), 63_040);
    assert_eq!(size_of::<SchedulerOutput<1024, Boxed>>(), 160);
    assert_eq!(size_of::<AdapterPool<64>>(), 3_864);
    assert_eq!(size_of::<AdapterPool<1024>>(), 60_504);
}

/// A scheduler and its output in statics, built at compile time.
static SCHEDULER: Mutex<Scheduler<Null, NoPeft, 1024, 64>> =
    Mutex::new(Scheduler::new_const(Config::DEFAULT, NULL, NoPeft));
static OUTPUT: Mutex<SchedulerOutput<1024>> = Mutex::new(SchedulerOutput::new());

#[test]
fn a_scheduler_and_its_output_live_in_statics() {
    let mut s = SCHEDULER.lock().unwrap();
    let mut out = OUTPUT.lock().unwrap();
    // As the heap-built one (400 KiB inline would not fit a test thread's stack in a debug build).
    let fresh = Scheduler::<Null, NoPeft, 1024, 64, Boxed>::boxed(Config::DEFAULT, NULL, NoPeft);
    assert_eq!(
        s.fingerprint(),
        fresh.unwrap().fingerprint(),
        "const = runtime"
    );
    let h = s
        .submit(RequestSpec::new(7, Phase::ContextInit, 100))
        .unwrap();
    s.schedule(&mut out).unwrap();
    // The backend gives no pages: the request waits.
    assert!(out.context().is_empty() && out.pass() == 1);
    assert_eq!(s.find(RequestId(7)), Some(h));
    s.remove(h).unwrap();
    assert!(s.is_empty() && s.check());
}

/// A small serving loop over a real pool: `(fingerprint, generation, context, paused)` after each
/// pass.
fn trace<S: Storage>(
    mut s: Scheduler<Pool, AdapterPool<4>, 32, 4, S>,
    mut out: SchedulerOutput<32, S>,
) -> Vec<(u64, u64, usize, usize, usize)> {
    for i in 0..24u64 {
        let spec =
            RequestSpec::new(i, Phase::ContextInit, 40 + 8 * (i as u32 % 5)).with_lora(i % 3);
        s.submit(spec).unwrap();
    }
    let mut seen = Vec::new();
    for _ in 0..40 {
        s.schedule(&mut out).unwrap();
        s.ensure_batch(&mut out).unwrap();
        let _ = s.take_moves();
        s.complete_step(&out).unwrap();
        assert!(s.check() && s.kv().check());
        let lens = (
            out.generation().len(),
            out.context().len(),
            out.paused().len(),
        );
        seen.push((
            s.fingerprint(),
            s.kv().fingerprint(),
            lens.0,
            lens.1,
            lens.2,
        ));
    }
    seen
}

#[test]
fn a_boxed_scheduler_behaves_as_an_inline_one() {
    let pool = || {
        let cfg = KvPoolConfig {
            tokens_per_block: 16,
            gpu_pages: 48,
            host_pages: 32,
            slots: 32,
            max_blocks: 16,
        };
        Pool::owned(cfg).unwrap()
    };
    let adapters = || {
        let mut a = AdapterPool::<4>::new(4, 8).unwrap();
        for t in 0..3 {
            a.register(TaskId(t), 1).unwrap();
        }
        a
    };
    let cfg = Config {
        max_num_tokens: Some(256),
        ..Config::DEFAULT
    };
    let inline = trace(
        Scheduler::new(cfg, pool(), adapters()).unwrap(),
        SchedulerOutput::new(),
    );
    let boxed = trace(
        Scheduler::boxed(cfg, pool(), adapters()).unwrap(),
        SchedulerOutput::new_in().unwrap(),
    );
    assert_eq!(inline, boxed);
    assert!(
        inline.iter().any(|t| t.4 > 0),
        "some pass suspended a request"
    );
}
