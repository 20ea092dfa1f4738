//! kvsched facade.
#![deny(missing_docs)]
pub use kvsched_core as core_api;
pub mod conformance;
pub mod plot;
pub mod workload;
