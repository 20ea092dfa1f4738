//! What the scenario tests share.
// Each test binary uses a part of it.
#![allow(dead_code)]

pub mod hybrid;
pub mod run;

use hybrid::r;
use kvsched_core::kv::{ContextPrep, KvBackend, PrefixReuse};

/// Prefills `prompt` tokens of `slot` in `chunk`-token chunks, committing each, as a scheduler does.
pub fn prefill<K: KvBackend + PrefixReuse>(
    k: &mut K,
    slot: u16,
    root: u64,
    h: &[u64],
    prompt: u32,
    chunk: u32,
) -> u32 {
    k.set_prefix(r(slot), root, h);
    let reused = k
        .prepare_context(r(slot), ContextPrep::first(prompt))
        .expect("prepared");
    let mut done = reused;
    while done < prompt {
        if done > reused {
            let later = ContextPrep {
                first_chunk: false,
                position: done,
                ..ContextPrep::first(prompt)
            };
            assert_eq!(k.prepare_context(r(slot), later), Some(0));
        }
        let next = (done + chunk).min(prompt);
        assert!(k.resize_context(r(slot), next, done == reused));
        k.commit(r(slot), next);
        done = next;
    }
    reused
}
