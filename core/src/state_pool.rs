//! Recurrent-state slots: the fixed-size state of a hybrid model's recurrent layers (Mamba-2's short
//! convolution window and SSM state, gated DeltaNet's), one live slot per request, in a GPU tier and
//! a host tier, and the *snapshots* that let a prompt resume from a cached prefix.
//!
//! A request's attention KV grows with its context; its recurrent state does not: it is one slot of
//! `slot_bytes` (the model's), rewritten by every token. So a request holds exactly one slot while it
//! has a cache: on the GPU while active, on the host tier while suspended (or held on the GPU when
//! the host tier is full, as pages are), none after a recompute pause or `free`.
//!
//! **Snapshots.** Prefix reuse on a recurrent layer needs the state *at* the hit point: a copy of a
//! request's state taken when its scan passed a snapshot point (a multiple of
//! [`StateConfig::snapshot_interval`] tokens: vLLM's "align" mode keeps states on such a grid too),
//! kept in a GPU slot under the key of the block that ends there. A snapshot is *pending* while the
//! step that writes it runs ([`StatePool::take_captures`] tells the engine where to write it), and
//! *ready*, so a hit may read it, only once that step is committed; a hit copies it into the new
//! request's live slot ([`StateOp::Restore`]). Snapshots are bounded
//! ([`StateConfig::snapshot_slots`]) and evicted least recently used; a live state that needs a slot
//! evicts a ready snapshot, so they never crowd out a request. The pool is plain mechanism:
//! [`crate::kv_groups::Hybrid`] decides when a request takes, moves, restores or captures its state.

use crate::error::Error;
use crate::ids::RequestId;
use crate::kv::Tier;
use crate::narrow::{u16_of, u32_of};
use crate::storage::{Inline, Storage};

mod log;
mod snapshots;

pub use log::{Capture, StateMove, StateOp};

/// A state pool's geometry and snapshot policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StateConfig {
    /// Bytes of one request's recurrent state (every recurrent layer's), set by the model.
    pub slot_bytes: u64,
    /// State slots on the GPU (live states, held suspended states and snapshots).
    pub gpu_slots: u32,
    /// State slots on the host tier (suspended states).
    pub host_slots: u32,
    /// Most GPU slots snapshots hold (0: no snapshot, vLLM's `mamba_cache_mode` "none").
    pub snapshot_slots: u32,
    /// Tokens between snapshot points: a whole number of attention blocks.
    pub snapshot_interval: u32,
}

impl StateConfig {
    /// The configuration against a capacity of `slots` slots and attention blocks of
    /// `tokens_per_block` tokens: `Invalid` for a slot of 0 bytes, no GPU slot, more slots than the
    /// capacity, snapshots that would leave no slot for a live state, or an interval that is not a
    /// whole number of blocks.
    pub const fn validate(&self, slots: usize, tokens_per_block: u32) -> Result<(), Error> {
        if self.slot_bytes == 0 {
            return Err(Error::Invalid("a state slot must hold at least one byte"));
        }
        if self.gpu_slots == 0 {
            return Err(Error::Invalid("a state pool needs at least one GPU slot"));
        }
        if self.gpu_slots as usize > slots || self.host_slots as usize > slots {
            return Err(Error::Invalid(
                "more state slots than the pool's capacity: raise its capacity parameter",
            ));
        }
        if self.snapshot_slots >= self.gpu_slots {
            return Err(Error::Invalid(
                "snapshots must leave at least one GPU state slot for a live request",
            ));
        }
        if self.snapshot_interval == 0
            || tokens_per_block == 0
            || self.snapshot_interval % tokens_per_block != 0
        {
            return Err(Error::Invalid(
                "a snapshot interval must be a whole number of attention blocks",
            ));
        }
        Ok(())
    }
}

/// Where a request's state is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Placement {
    /// It has none.
    #[default]
    None,
    /// Live in GPU slot `.0`.
    Gpu(u32),
    /// Suspended to host slot `.0`.
    Host(u32),
    /// Suspended, held in GPU slot `.0` (the host tier had no room).
    Held(u32),
}

/// What a GPU slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) enum Use {
    #[default]
    Free,
    /// The state of request row `.0` (live or held).
    Row(u16),
    /// A snapshot under `key`: `ready` once its step is committed, `row` the row writing it, `used`
    /// its last use (LRU), `position` where it was taken.
    Snapshot {
        key: u64,
        ready: bool,
        row: u16,
        used: u64,
        position: u32,
    },
}

/// Counters since construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StateStats {
    /// Snapshots made ready.
    pub snapshots: u64,
    /// Hits restored from a snapshot.
    pub hits: u64,
    /// Ready snapshots evicted (by the bound or for a live state).
    pub evicted: u64,
    /// States moved to the host tier.
    pub offloaded: u64,
    /// States moved back to the GPU.
    pub reloaded: u64,
}

/// The state slots of up to `C` requests in up to `C` slots a tier ([the module docs](self)): `C` bounds
/// the request rows, each tier's slots and each log (`C` entries between takes: a move the log has
/// no room for is not made — a suspension holds the state on the GPU, a resumption or a hit is
/// refused — so a driver drains the logs every step).
/// Its arrays and logs live in `S` ([`crate::storage`]): inside the value ([`Inline`], about 130
/// bytes a row) or each on the heap (`Boxed`, feature `alloc`), so that a large pool never passes
/// through the stack.
pub struct StatePool<const C: usize, S: Storage = Inline> {
    cfg: StateConfig,
    gpu: S::Array<Use, C>,
    /// Host slot → the row whose state it holds.
    host: S::Array<Option<u16>, C>,
    rows: S::Array<Placement, C>,
    clock: u64,
    log: log::Log<C, S>,
    stats: StateStats,
}

impl<const C: usize, S: Storage> core::fmt::Debug for StatePool<C, S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("StatePool")
            .field("cfg", &self.cfg)
            .field("rows", &&self.rows[..])
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<const C: usize, S: Storage> StatePool<C, S> {
    /// An empty pool (`Invalid` as [`StateConfig::validate`] says, against attention blocks of
    /// `tokens_per_block` tokens).
    pub fn new(cfg: StateConfig, tokens_per_block: u32) -> Result<Self, Error> {
        cfg.validate(C, tokens_per_block)?;
        if C > u16::MAX as usize {
            return Err(Error::Invalid("a state pool keeps at most 65,535 rows"));
        }
        Ok(Self {
            cfg,
            gpu: S::array(|| Use::Free)?,
            host: S::array(|| None)?,
            rows: S::array(|| Placement::None)?,
            clock: 0,
            log: log::Log::new()?,
            stats: StateStats::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> StateConfig {
        self.cfg
    }

    /// The counters.
    pub fn stats(&self) -> StateStats {
        self.stats
    }

    /// Where row `row`'s state is ([`Placement::None`] past the rows).
    pub fn placement(&self, row: u16) -> Placement {
        self.rows.get(row as usize).copied().unwrap_or_default()
    }

    /// GPU slots free.
    pub fn gpu_free(&self) -> u32 {
        u32_of(self.gpu_slots().iter().filter(|u| **u == Use::Free).count())
    }

    fn gpu_slots(&self) -> &[Use] {
        &self.gpu[..self.cfg.gpu_slots as usize]
    }

    /// Side-effect free: row `row` could have its state live on the GPU now (it has it, holds it,
    /// or a slot is free or held by a ready snapshot).
    pub fn can_place(&self, row: u16) -> bool {
        match self.placement(row) {
            Placement::Gpu(_) | Placement::Held(_) => true,
            Placement::None | Placement::Host(_) => self.log.has_room() && self.obtainable(None),
        }
    }

    /// Side-effect free: a request without a state could take one now ([`StatePool::take`]), from
    /// snapshot slot `from` or zero.
    pub fn can_take(&self, from: Option<u32>) -> bool {
        match from {
            // With no other slot, the request takes the snapshot's own slot over.
            Some(s) => self.is_ready(s),
            None => self.log.has_room() && self.obtainable(None),
        }
    }

    /// A GPU slot could be had, not counting snapshot slot `spare`.
    fn obtainable(&self, spare: Option<u32>) -> bool {
        self.gpu_slots().iter().enumerate().any(|(g, u)| match u {
            Use::Free => true,
            Use::Snapshot { ready: true, .. } => Some(u32_of(g)) != spare,
            _ => false,
        })
    }

    /// A free GPU slot, evicting the least recently used ready snapshot (not `spare`) when none is.
    fn take_gpu(&mut self, spare: Option<u32>) -> Option<u32> {
        if let Some(g) = self.gpu_slots().iter().position(|u| *u == Use::Free) {
            return Some(u32_of(g));
        }
        let g = self.oldest_ready(spare)?;
        self.gpu[g as usize] = Use::Free;
        self.stats.evicted += 1;
        Some(g)
    }

    /// Row `row` (request `id`) takes a live state: zero (the engine starts it), or the copy of
    /// snapshot slot `from` (a hit; when no other slot can be had, the snapshot's slot itself
    /// becomes the live one, its state already in place, and the snapshot is gone). `false`,
    /// nothing changed: no slot, or it has a state.
    pub fn take(&mut self, row: u16, id: RequestId, from: Option<u32>) -> bool {
        let i = row as usize;
        if i >= C || self.rows[i] != Placement::None || !self.can_take(from) {
            return false;
        }
        let other = if self.log.has_room() {
            self.take_gpu(from)
        } else {
            None
        };
        let Some(g) = other else {
            // `can_take` vouched for the snapshot's own slot.
            let Some(s) = from else { return false };
            self.gpu[s as usize] = Use::Row(row);
            self.rows[i] = Placement::Gpu(s);
            self.stats.hits += 1;
            return true;
        };
        self.gpu[g as usize] = Use::Row(row);
        self.rows[i] = Placement::Gpu(g);
        if let Some(src) = from {
            self.touch(src);
            self.stats.hits += 1;
            self.log
                .moves
                .push(StateMove::new(id, StateOp::Restore, src, g));
        }
        true
    }

    /// Suspends row `row`'s live state: to the host tier when a host slot is free, else held.
    pub fn suspend(&mut self, row: u16, id: RequestId) {
        let i = row as usize;
        let Some(Placement::Gpu(g)) = self.rows.get(i).copied() else {
            return;
        };
        self.drop_pending(row);
        let h = self.host[..self.cfg.host_slots as usize]
            .iter()
            .position(Option::is_none);
        match h {
            Some(h) if self.log.has_room() => {
                self.host[h] = Some(row);
                self.gpu[g as usize] = Use::Free;
                self.rows[i] = Placement::Host(u32_of(h));
                self.stats.offloaded += 1;
                self.log
                    .moves
                    .push(StateMove::new(id, StateOp::Move(Tier::Gpu), g, u32_of(h)));
            }
            _ => self.rows[i] = Placement::Held(g),
        }
    }

    /// Makes row `row`'s suspended state live again (a host copy needs a GPU slot); `false`,
    /// nothing changed, when it cannot (or it has no state).
    pub fn resume(&mut self, row: u16, id: RequestId) -> bool {
        let i = row as usize;
        match self.rows.get(i).copied().unwrap_or_default() {
            Placement::Gpu(_) => true,
            Placement::None => false,
            Placement::Held(g) => {
                self.rows[i] = Placement::Gpu(g);
                true
            }
            Placement::Host(h) => {
                if !self.log.has_room() {
                    return false;
                }
                let Some(g) = self.take_gpu(None) else {
                    return false;
                };
                self.gpu[g as usize] = Use::Row(row);
                self.host[h as usize] = None;
                self.rows[i] = Placement::Gpu(g);
                self.stats.reloaded += 1;
                self.log
                    .moves
                    .push(StateMove::new(id, StateOp::Move(Tier::Host), h, g));
                true
            }
        }
    }

    /// Row `row` (request `id`) gives its state up, and the moves into it it logged last are
    /// withdrawn (a restore made for a first chunk that was then refused: no longer a hit).
    pub fn withdraw(&mut self, row: u16, id: RequestId) {
        if let Placement::Gpu(g) = self.placement(row) {
            while self
                .log
                .moves
                .last()
                .is_some_and(|m| m.request == id && m.dst == g && m.op != StateOp::Move(Tier::Gpu))
            {
                if self
                    .log
                    .moves
                    .last()
                    .is_some_and(|m| m.op == StateOp::Restore)
                {
                    self.stats.hits -= 1;
                }
                self.log.moves.pop();
            }
        }
        self.release(row);
    }

    /// Row `row` gives its state up (a recompute pause, `free`), and any snapshot it was writing.
    pub fn release(&mut self, row: u16) {
        let i = row as usize;
        if i >= C {
            return;
        }
        self.drop_pending(row);
        match self.rows[i] {
            Placement::None => {}
            Placement::Gpu(g) | Placement::Held(g) => self.gpu[g as usize] = Use::Free,
            Placement::Host(h) => self.host[h as usize] = None,
        }
        self.rows[i] = Placement::None;
    }

    /// The state moves logged since the last call, in order: the engine runs them before the step.
    pub fn take_moves(&mut self) -> &[StateMove] {
        self.log.moves.take()
    }

    /// The snapshots to write during the step, logged since the last call.
    pub fn take_captures(&mut self) -> &[Capture] {
        self.log.captures.take()
    }

    /// A fingerprint of the whole state ([`crate::fingerprint`]): a refused operation leaves it
    /// unchanged.
    pub fn fingerprint(&self) -> u64 {
        use core::hash::{Hash, Hasher};
        let mut h = crate::fingerprint::Fingerprint::new();
        self.cfg.hash(&mut h);
        (*self.gpu).hash(&mut h);
        (*self.host).hash(&mut h);
        (*self.rows).hash(&mut h);
        self.clock.hash(&mut h);
        self.log.hash(&mut h);
        self.stats.hash(&mut h);
        h.finish()
    }

    /// Every slot agrees with every row: a row's slot names it back, no slot is named twice, and
    /// snapshots stay within their bound.
    pub fn check(&self) -> bool {
        let rows_agree = self.rows.iter().enumerate().all(|(i, p)| match *p {
            Placement::None => true,
            Placement::Gpu(g) | Placement::Held(g) => {
                self.gpu.get(g as usize) == Some(&Use::Row(u16_of(i)))
            }
            Placement::Host(h) => self.host.get(h as usize) == Some(&Some(u16_of(i))),
        });
        let gpu_agree = self.gpu.iter().enumerate().all(|(g, u)| match *u {
            Use::Row(r) => matches!(
                self.placement(r),
                Placement::Gpu(x) | Placement::Held(x) if x == u32_of(g)
            ),
            _ => true,
        });
        let host_agree = self
            .host
            .iter()
            .enumerate()
            .all(|(h, r)| r.is_none_or(|r| self.placement(r) == Placement::Host(u32_of(h))));
        let beyond = self.gpu[self.cfg.gpu_slots as usize..]
            .iter()
            .all(|u| *u == Use::Free)
            && self.host[self.cfg.host_slots as usize..]
                .iter()
                .all(Option::is_none);
        rows_agree
            && gpu_agree
            && host_agree
            && beyond
            && self.snapshots() <= self.cfg.snapshot_slots
    }
}
