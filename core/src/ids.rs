//! The vocabulary every layer names: request and adapter task ids, and an adapter task's slot.

/// A request id (unique among live requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct RequestId(pub u64);

/// A LoRA task (adapter) id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct TaskId(pub u64);

/// A task's dense slot in the adapter cache's task table; a list entry holds one of two marks in
/// its place ([`TaskSlot::NONE`], [`TaskSlot::UNCACHED`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(transparent)]
pub struct TaskSlot(pub u16);

impl TaskSlot {
    /// No LoRA task (a list entry's mark).
    pub const NONE: TaskSlot = TaskSlot(u16::MAX);
    /// A LoRA task without a slot in the adapter cache (sorted by its id, not counted).
    pub const UNCACHED: TaskSlot = TaskSlot(u16::MAX - 1);

    /// The slot as an index into a table of tasks.
    #[inline(always)]
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl From<TaskSlot> for usize {
    #[inline(always)]
    fn from(slot: TaskSlot) -> usize {
        slot.index()
    }
}

impl core::fmt::Display for TaskSlot {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::NONE => f.write_str("none"),
            Self::UNCACHED => f.write_str("uncached"),
            TaskSlot(s) => write!(f, "{s}"),
        }
    }
}
