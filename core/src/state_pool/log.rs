//! What the state pool tells the engine: the state moves to run before a step, and the snapshots to
//! write during it.

use crate::ids::RequestId;
use crate::kv::Tier;

/// What a state move does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StateOp {
    /// Copies the state from slot `src` of this tier to slot `dst` of the other (suspension: from
    /// the GPU; resumption: from the host).
    Move(Tier),
    /// Copies snapshot slot `src` into live slot `dst`, both on the GPU (a prefix hit resumes from
    /// the snapshot). The snapshot stays.
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

/// A list of at most `2 × R` entries, emptied by [`List::take`].
#[derive(Debug)]
pub(crate) struct List<T, const R: usize> {
    items: [[T; R]; 2],
    len: usize,
}

impl<T: Copy + Default, const R: usize> List<T, R> {
    const fn filled(t: T) -> Self {
        Self {
            items: [[t; R]; 2],
            len: 0,
        }
    }

    pub(crate) const fn has_room(&self) -> bool {
        self.len < 2 * R
    }

    /// Appends `t`; the caller checked [`List::has_room`].
    pub(crate) fn push(&mut self, t: T) {
        assert!(self.has_room(), "a state log past its room");
        self.items[self.len / R][self.len % R] = t;
        self.len += 1;
    }

    /// The entries logged, in order.
    fn logged(&self) -> &[T] {
        &self.items.as_flattened()[..self.len]
    }

    /// The entries, in order; the list is then empty.
    pub(crate) fn take(&mut self) -> &[T] {
        let n = core::mem::take(&mut self.len);
        let flat = self.items.as_flattened();
        &flat[..n]
    }
}

/// The two logs of a state pool.
#[derive(Debug)]
pub(crate) struct Log<const R: usize> {
    pub(crate) moves: List<StateMove, R>,
    pub(crate) captures: List<Capture, R>,
}

impl<const R: usize> Log<R> {
    pub(crate) const fn new() -> Self {
        Self {
            moves: List::filled(StateMove::new(RequestId(0), StateOp::Restore, 0, 0)),
            captures: List::filled(Capture {
                request: RequestId(0),
                position: 0,
                slot: 0,
            }),
        }
    }

    /// Hashes what is logged.
    pub(crate) fn hash<H: core::hash::Hasher>(&self, h: &mut H) {
        use core::hash::Hash;
        self.moves.logged().hash(h);
        self.captures.logged().hash(h);
    }

    /// A move can be logged.
    pub(crate) const fn has_room(&self) -> bool {
        self.moves.has_room()
    }
}
