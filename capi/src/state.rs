//! A hybrid recurrent model's state group through the C ABI (issue 46): each scheduled request's
//! live GPU state slot is its entry's `state_slot`; the state moves to run before the step
//! ([`kvsched_take_state_moves`]) and the snapshots to write during it ([`kvsched_take_captures`])
//! are plain-old-data lists the engine owns. docs/HYBRID.md has the rules.

use kvsched_core::kv::Tier;
use kvsched_core::state_pool::{Capture, StateMove, StateOp};

use crate::{guard, set_error, Engine, KvschedStatus};

/// `KvschedEntry::state_slot` of a request without a live GPU state slot (or of an engine without
/// a state group).
pub const KVSCHED_NO_STATE_SLOT: u32 = u32::MAX;

/// `KvschedStateMove::op`: a suspension; copy GPU state slot `src` to host state slot `dst`.
pub const KVSCHED_STATE_TO_HOST: u8 = 0;
/// `KvschedStateMove::op`: a resumption; copy host state slot `src` to GPU state slot `dst`.
pub const KVSCHED_STATE_TO_GPU: u8 = 1;
/// `KvschedStateMove::op`: a prefix hit; copy GPU snapshot slot `src` into the request's live GPU
/// slot `dst` (the snapshot stays).
pub const KVSCHED_STATE_RESTORE: u8 = 2;

/// One state copy to run before the step (after the page moves), in log order.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KvschedStateMove {
    /// Whose state.
    pub request: u64,
    /// Source state slot (its tier: see `op`).
    pub src: u32,
    /// Destination state slot.
    pub dst: u32,
    /// [`KVSCHED_STATE_TO_HOST`], [`KVSCHED_STATE_TO_GPU`] or [`KVSCHED_STATE_RESTORE`].
    pub op: u8,
}

impl KvschedStateMove {
    pub(crate) fn of(m: &StateMove) -> Self {
        Self {
            request: m.request.0,
            src: m.src,
            dst: m.dst,
            op: match m.op {
                StateOp::Move(Tier::Gpu) => KVSCHED_STATE_TO_HOST,
                StateOp::Move(Tier::Host) => KVSCHED_STATE_TO_GPU,
                StateOp::Restore => KVSCHED_STATE_RESTORE,
            },
        }
    }
}

/// A snapshot to write during the step: once request `request`'s scan has passed `position` tokens
/// of its prompt, copy its state into GPU state slot `slot`. A capture whose request runs no chunk
/// covering `position` is skipped (it never becomes a prefix hit).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KvschedCapture {
    /// Whose state.
    pub request: u64,
    /// The tokens scanned when the state is copied (a snapshot point).
    pub position: u32,
    /// The GPU state slot the copy goes to.
    pub slot: u32,
}

impl Engine {
    /// The state moves since the last call, copied for the copy engine (none without a state
    /// group).
    pub fn take_state_moves(&mut self) -> &[KvschedStateMove] {
        let moves = self.sched.take_state_moves();
        let l = &mut self.lists.state_moves;
        l.clear();
        l.extend(moves.iter().map(KvschedStateMove::of));
        l
    }

    /// The snapshots to write during the step, logged since the last call (none without a state
    /// group).
    pub fn take_captures(&mut self) -> &[KvschedCapture] {
        let captures = self.sched.take_captures();
        let l = &mut self.lists.captures;
        l.clear();
        l.extend(captures.iter().map(|c: &Capture| KvschedCapture {
            request: c.request.0,
            position: c.position,
            slot: c.slot,
        }));
        l
    }

    /// The engine has a state group (`state_gpu_slots` > 0).
    pub fn is_hybrid(&self) -> bool {
        self.sched.hybrid().is_some()
    }
}

/// The state moves logged since the last call, in order: run them after the page moves
/// ([`crate::kvsched_take_moves`]), before the step. `*n` entries, valid until the next call that
/// changes the engine; none without a state group. Drain them every step, with the captures: the
/// logs hold two entries a request between takes, and a resumption is refused for want of room.
///
/// # Safety
/// `engine` comes from [`crate::kvsched_engine_new`]; `moves` and `n` are valid.
#[no_mangle]
pub unsafe extern "C" fn kvsched_take_state_moves(
    engine: *mut Engine,
    moves: *mut *const KvschedStateMove,
    n: *mut usize,
) -> KvschedStatus {
    // SAFETY: the caller's contract: valid or null.
    let (Some(moves), Some(n)) = (unsafe { moves.as_mut() }, unsafe { n.as_mut() }) else {
        set_error("kvsched_take_state_moves: null moves or n");
        return KvschedStatus::NullPointer;
    };
    guard(engine, |e| {
        let m = e.take_state_moves();
        (*moves, *n) = (m.as_ptr(), m.len());
        Ok(())
    })
}

/// The snapshots to write during the step, logged since the last call ([`KvschedCapture`]). `*n`
/// entries, valid until the next call that changes the engine; none without a state group.
///
/// # Safety
/// `engine` comes from [`crate::kvsched_engine_new`]; `captures` and `n` are valid.
#[no_mangle]
pub unsafe extern "C" fn kvsched_take_captures(
    engine: *mut Engine,
    captures: *mut *const KvschedCapture,
    n: *mut usize,
) -> KvschedStatus {
    // SAFETY: the caller's contract: valid or null.
    let (Some(captures), Some(n)) = (unsafe { captures.as_mut() }, unsafe { n.as_mut() }) else {
        set_error("kvsched_take_captures: null captures or n");
        return KvschedStatus::NullPointer;
    };
    guard(engine, |e| {
        let c = e.take_captures();
        (*captures, *n) = (c.as_ptr(), c.len());
        Ok(())
    })
}
