//! The batch delta: what changed in the batch since the engine last asked, for an engine that keeps a
//! persistent batch of its own (as vLLM's model runner does) instead of rebuilding it from the full
//! lists every step.
//!
//! The batch is the output's context, generation and encoder lists. [`Scheduler::take_delta`] compares
//! the last pass's batch with the one of the previous call and fills a [`BatchDelta`]:
//!
//! - `entered`: in the batch now, not at the previous call (new, resumed, admitted, re-admitted after a
//!   recompute pause: the engine sets up its row);
//! - `left`: in the batch at the previous call, not now (finished and removed, suspended,
//!   recompute-paused, preempted, or not scheduled this pass: the engine drops its row). An entry names
//!   the request as it was listed then (its slot and version): one removed since is still named;
//! - `changed`: in both, but its entry is not the plain next step: a context chunk (every chunk is a new
//!   one), or a request that moved from one list to another (its prompt done, it decodes now).
//!
//! A request in both as a decode step is in none of the three: its next step is its last one plus its
//! tokens. Computing a delta costs O(the two batches) and nothing at all when every pass since the
//! previous call was incremental (the batch was kept: the delta is empty); an engine that never asks
//! pays nothing.
//!
//! [`Scheduler::take_delta`]: crate::scheduler::Scheduler::take_delta

use crate::output::Listed;
use crate::storage::{FixedList, Inline, Storage};

/// What changed in the batch between two calls of `Scheduler::take_delta`: lists of up to `N`
/// entries, where `S` keeps them.
#[derive(Debug, Clone)]
pub struct BatchDelta<const N: usize, S: Storage = Inline> {
    pub(crate) entered: S::List<Listed, N>,
    pub(crate) left: S::List<Listed, N>,
    pub(crate) changed: S::List<Listed, N>,
    /// The pass the delta brings the engine's batch to (0: none yet).
    pub(crate) pass: u64,
}

impl<const N: usize> Default for BatchDelta<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> BatchDelta<N> {
    /// An empty delta inside the value (const: a `static` can hold it).
    pub const fn new() -> Self {
        Self {
            entered: heapless::Vec::new(),
            left: heapless::Vec::new(),
            changed: heapless::Vec::new(),
            pass: 0,
        }
    }
}

impl<const N: usize, S: Storage> BatchDelta<N, S> {
    /// An empty delta in storage `S`. Refused only when `S` cannot have the memory.
    pub fn new_in() -> Result<Self, crate::Error> {
        Ok(Self {
            entered: S::list(Listed::EMPTY)?,
            left: S::list(Listed::EMPTY)?,
            changed: S::list(Listed::EMPTY)?,
            pass: 0,
        })
    }

    /// Requests in the batch now that were not at the previous call.
    pub fn entered(&self) -> &[Listed] {
        &self.entered
    }
    /// Requests in the batch at the previous call that are not now (as they were listed then).
    pub fn left(&self) -> &[Listed] {
        &self.left
    }
    /// Requests in both whose entry is not the plain next decode step (a chunk, or another list).
    pub fn changed(&self) -> &[Listed] {
        &self.changed
    }
    /// Nothing changed: every request of the batch takes its next decode step.
    pub fn is_empty(&self) -> bool {
        self.entered.is_empty() && self.left.is_empty() && self.changed.is_empty()
    }
    /// The pass whose batch the delta leads to.
    pub fn pass(&self) -> u64 {
        self.pass
    }

    pub(crate) fn clear(&mut self) {
        self.entered.clear();
        self.left.clear();
        self.changed.clear();
    }
}

/// Where a request was in the batch the last delta led to: its version (0 with `list` 0: nowhere).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) struct Seen {
    pub(crate) version: u32,
    /// 0: not in that batch; 1 context, 2 generation, 3 encoder.
    pub(crate) list: u8,
}

impl Seen {
    pub(crate) const NOWHERE: Seen = Seen {
        version: 0,
        list: 0,
    };
}

/// The list codes of [`Seen::list`].
pub(crate) const CONTEXT: u8 = 1;
pub(crate) const GENERATION: u8 = 2;
pub(crate) const ENCODER: u8 = 3;

/// Marks a [`Seen`] of the batch being compared (cleared before the call returns).
pub(crate) const NOW: u8 = 0x80;

/// Pushes into a delta list (at most one entry per table slot in each: it cannot overflow).
#[track_caller]
pub(crate) fn push<L: FixedList<Listed>>(list: &mut L, l: Listed) {
    assert!(
        list.push(l).is_ok(),
        "a delta list holds one entry per slot"
    );
}
