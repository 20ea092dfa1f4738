//! A hybrid recurrent model on kvsched's state slots ([`kvsched_core::kv_groups::Hybrid`]): a
//! mechanism model of Mamba-2-style recurrent layers and attention layers with seeded random
//! weights ([`HybridModel`]; no small hybrid model is fetchable in GGUF form here), and an engine
//! that serves it through kvsched-core's scheduler, carrying out every page move, state move,
//! snapshot restore and snapshot capture on real memory ([`HybridEngine`]). Its identity tests
//! (`engine/tests/hybrid.rs`) compare every request's tokens and logits, bit for bit, with the same
//! request run alone ([`HybridModel::reference`]).

mod engine;
mod forward;
mod mamba;
mod mechanism;
mod poison;
mod store;

pub use engine::{HybridCompletion, HybridConfig, HybridEngine, HybridStats, HYBRID_REQUESTS};
pub use mamba::MambaDims;
pub use mechanism::{HybridModel, HybridSpec};
