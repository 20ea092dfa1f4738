//! What the state pool tells the engine: the state moves to run before a step, and the snapshots to
//! write during it.

use crate::error::Error;
use crate::ids::RequestId;
use crate::kv::Tier;
use crate::storage::Storage;

/// What a state move does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StateOp {
    /// Copies the state from slot `src` of this tier to slot `dst` of the other (suspension: from
    /// the GPU; resumption: from the host).
    Move(Tier),
    /// Copies snapshot slot `src` into live slot `dst`, both on the GPU (a prefix hit resumes from
    /// the snapshot). The snapshot stays, though its slot may be given to another state later in
    /// the same pass: the engine runs the log in order before the step, and starts no state and
    /// writes no capture until then.
    #[default]
    Restore,
}

/// One state copy the engine runs before the step, in log order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StateMove {
    /// Whose state.
    pub request: RequestId,
    /// What it does.
    pub op: StateOp,
    /// Source slot.
    pub src: u32,
    /// Destination slot.
    pub dst: u32,
}

impl StateMove {
    pub(crate) const fn new(request: RequestId, op: StateOp, src: u32, dst: u32) -> Self {
        Self {
            request,
            op,
            src,
            dst,
        }
    }
}

/// A snapshot the engine writes during the step: request `request`'s state right after its token at
/// `position − 1` (its first `position` tokens scanned) into GPU slot `slot`. Its chunk must cover
/// that position; a capture whose chunk does not run is never committed (the slot is returned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Capture {
    /// Whose state.
    pub request: RequestId,
    /// The tokens scanned when the state is copied (a snapshot point).
    pub position: u32,
    /// The GPU slot the copy goes to.
    pub slot: u32,
}

/// A list of at most `R` entries, emptied by [`List::take`], its room in `S` (built entry by entry:
/// nothing of `R` entries passes through the stack).
pub(crate) struct List<T, const R: usize, S: Storage> {
    items: S::Array<T, R>,
    len: usize,
}

impl<T: Copy + Default, const R: usize, S: Storage> List<T, R, S> {
    fn filled(t: T) -> Result<Self, Error> {
        Ok(Self {
            items: S::array(|| t)?,
            len: 0,
        })
    }

    pub(crate) fn has_room(&self) -> bool {
        self.len < R
    }

    /// Appends `t`; the caller checked [`List::has_room`].
    pub(crate) fn push(&mut self, t: T) {
        assert!(self.has_room(), "a state log past its room");
        self.items[self.len] = t;
        self.len += 1;
    }

    /// The last entry logged.
    pub(crate) fn last(&self) -> Option<&T> {
        self.logged().last()
    }

    /// Withdraws the last entry logged.
    pub(crate) fn pop(&mut self) {
        self.len = self.len.saturating_sub(1);
    }

    /// The entries logged, in order.
    fn logged(&self) -> &[T] {
        &self.items[..self.len]
    }

    /// The entries, in order; the list is then empty.
    pub(crate) fn take(&mut self) -> &[T] {
        let n = core::mem::take(&mut self.len);
        &self.items[..n]
    }
}

/// The two logs of a state pool.
pub(crate) struct Log<const R: usize, S: Storage> {
    pub(crate) moves: List<StateMove, R, S>,
    pub(crate) captures: List<Capture, R, S>,
}

impl<const R: usize, S: Storage> Log<R, S> {
    pub(crate) fn new() -> Result<Self, Error> {
        Ok(Self {
            moves: List::filled(StateMove::default())?,
            captures: List::filled(Capture::default())?,
        })
    }

    /// Hashes what is logged.
    pub(crate) fn hash<H: core::hash::Hasher>(&self, h: &mut H) {
        use core::hash::Hash;
        self.moves.logged().hash(h);
        self.captures.logged().hash(h);
    }

    /// A move can be logged.
    pub(crate) fn has_room(&self) -> bool {
        self.moves.has_room()
    }
}
