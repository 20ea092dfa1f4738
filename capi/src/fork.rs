//! Forks through the C ABI (issue 44): a child request that starts on its parent's full pages.

use crate::{guard_id, set_error, Engine, KvschedRequest, KvschedStatus};

/// Forks request `child` (its id, its prompt: the parent's first `child->prompt` tokens, which the
/// caller vouches for; its output and adapter) off request `parent`, active on the GPU: the child
/// starts active holding the parent's full pages before its last token by reference, at the
/// position they cover, which `*shared` receives; its first chunk computes the rest. From then on it
/// is a request of its own. Refused (`KVSCHED_STATUS_INVALID`, nothing changed) where the pool has
/// no prefix cache (whose reference counts share the pages), for a parent not active, or a child not
/// its parent's (another adapter, longer than the parent computed, less than a page to share).
///
/// # Safety
/// `engine` comes from [`crate::kvsched_engine_new`]; `child` and `shared` are valid.
#[no_mangle]
pub unsafe extern "C" fn kvsched_fork(
    engine: *mut Engine,
    parent: u64,
    child: *const KvschedRequest,
    shared: *mut u32,
) -> KvschedStatus {
    // SAFETY: the caller's contract: valid or null.
    let (Some(r), Some(out)) = (unsafe { child.as_ref() }, unsafe { shared.as_mut() }) else {
        set_error("kvsched_fork: null child or shared pointer");
        return KvschedStatus::NullPointer;
    };
    *out = 0;
    guard_id(engine, Some(parent), |e| {
        *out = e.fork(parent, r)?;
        Ok(())
    })
}
