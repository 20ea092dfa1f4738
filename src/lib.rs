//! # kvsched
//!
//! A scheduler core for LLM serving. This crate is the facade: it re-exports the `no_std` core
//! ([`kvsched_core`], as [`core_api`]) with its storage choices ([`storage`]), and carries the command
//! line's parts: the trace simulator ([`sim`], [`workload`], [`plot`]), the conformance runner
//! ([`conformance`]) and the in-process benchmark ([`bench`](mod@bench)).
#![deny(missing_docs)]

pub use kvsched_core as core_api;

pub mod args;
pub mod bench;
pub mod conformance;
pub use kvsched_core::storage;
pub mod plot;
pub mod sim;
pub mod stats;
pub mod workload;
