//! What the ABI tests share: the thread's last error message, and a plain request.

use std::ffi::CStr;

use kvsched_capi::{kvsched_last_error, KvschedRequest};

/// The calling thread's last error message.
pub fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated string it keeps until the thread's next call.
    unsafe { CStr::from_ptr(kvsched_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// A plain request of `prompt` tokens and 8 output tokens, no adapter, no salt.
pub fn request(id: u64, prompt: u32) -> KvschedRequest {
    KvschedRequest {
        id,
        lora_task: 0,
        prompt,
        max_new_tokens: 8,
        beam: 1,
        draft: 0,
        cache_salt: 0,
        arrival: 0,
        has_lora: 0,
        kind: 0,
        priority: 0,
        service_class: 0,
    }
}
