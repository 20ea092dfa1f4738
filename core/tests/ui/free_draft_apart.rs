// A request's caches are one backend (KvSet): its draft pool is lent out read-only, so the draft cache
// cannot be freed apart from the target's.
use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::kv::{KvBackend, KvRef};
use kvsched_core::kv_set::KvSet;
use kvsched_core::{KvPool, Scheduler};

fn free_draft_only(s: &mut Scheduler<KvSet<KvPool<'_>>, AdapterPool<4>, 4, 4>, r: KvRef) {
    if let Some((_, draft)) = s.kv().draft_pool() {
        draft.free(r);
    }
}

fn main() {}
