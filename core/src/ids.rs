//! The vocabulary every layer names: request and adapter task ids, and the sentinel of a listed entry
//! without an adapter task slot.

/// A request id (unique among live requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct RequestId(pub u64);

/// A LoRA task (adapter) id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct TaskId(pub u64);

/// No adapter task.
pub const NO_TASK: u16 = u16::MAX;
