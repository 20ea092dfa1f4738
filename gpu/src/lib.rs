//! Binds kvsched-core's arenas to CUDA device memory.
#![deny(missing_docs)]
