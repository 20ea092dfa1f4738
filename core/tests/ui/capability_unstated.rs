// A backend states every capability: one that implements the cross pool's operations but does not
// name them (`type Cross`) does not compile, so it cannot silently go without them.
use kvsched_core::kv::{
    Absent, CacheState, ContextPrep, CrossPool, KvBackend, KvLimits, KvRef, PageMove,
};

struct Pool;

impl CrossPool for Pool {
    fn prepare_cross(&mut self, _: KvRef, _: bool) -> bool {
        true
    }
    fn resize_cross(&mut self, _: KvRef, _: u32) -> bool {
        true
    }
    fn suspend_cross(&mut self, _: KvRef) {}
    fn max_cross_tokens(&self) -> u64 {
        u64::MAX
    }
    fn take_cross_moves(&mut self) -> &[PageMove] {
        &[]
    }
}

impl KvBackend for Pool {
    type Draft = Absent;
    type Transfers = Absent;
    type Prefix = Absent;
    type Adapters = Absent;

    fn limits(&self) -> KvLimits {
        KvLimits {
            tier_below_gpu: false,
            can_evict: false,
            max_tokens_per_request: u64::MAX,
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

fn main() {}
