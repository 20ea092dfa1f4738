//! Building a scheduler where it is to live. Its fixed-capacity arrays (the request table, the pass
//! scratch, the fairness counters, the per-slot arrays, the adapter desk's) are kept where its storage
//! parameter `S` says:
//!
//! - [`Inline`] (the default): inside the value. [`Scheduler::new`] builds one on the stack (fine for a
//!   small `N`); [`Scheduler::new_const`] is a `const fn`, so a `static` can hold a whole scheduler
//!   built at compile time, as embassy's `TaskPool::new` is.
//! - `Boxed` (feature `alloc`): every array and list its own heap allocation, filled in place;
//!   [`Scheduler::new_in`] (or `Scheduler::boxed`) builds it without putting any array on the stack,
//!   and the value itself is small (see the crate docs for the sizes).

use crate::adapter::PeftBackend;
use crate::config::Config;
use crate::error::Error;
use crate::kv::KvBackend;
use crate::lease::AdapterDesk;
use crate::storage::{InlineArray, Storage};

use super::admission::Clients;
use super::pass::{PassStats, Scratch};
use super::table::Table;
use super::transfer::TransferStats;
use super::Scheduler;

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize> Scheduler<K, P, N, T> {
    /// A scheduler over the given backends, its arrays inside the value (large for a large `N`: see
    /// the crate docs for where a scheduler may live). Refused for an invalid configuration.
    pub fn new(cfg: Config, kv: K, peft: P) -> Result<Self, Error> {
        cfg.validate()?;
        fits(&cfg, &kv)?;
        Ok(Self::inline(cfg, kv, peft))
    }
}

/// What the configuration asks of the KV backend that it cannot give: GUARANTEED_NO_EVICT reserves a
/// request's whole life at admission; by capacity (the default) its capacity runs ahead of the tokens
/// computed, and a backend that gives up a sliding window's pages by the capacity would give up pages
/// the next queries read, unless it keeps the reservation itself ([`crate::kv::KvLimits::reserves`]).
fn fits<K: KvBackend>(cfg: &Config, kv: &K) -> Result<(), Error> {
    let l = kv.limits();
    if cfg.policy == crate::config::CapacityPolicy::GuaranteedNoEvict
        && l.sliding_windows
        && !l.reserves
    {
        return Err(Error::Invalid(
            "GUARANTEED_NO_EVICT over sliding windows needs a backend that reserves in pages (KV groups of page pools; not a draft set)",
        ));
    }
    Ok(())
}

impl<K, P, const N: usize, const T: usize> Scheduler<K, P, N, T> {
    /// [`Scheduler::new`] as a `const fn`, for a `static` (backends that are themselves
    /// const-constructible, such as [`crate::NoPeft`] or a const [`crate::AdapterPool`]). Panics on an
    /// invalid configuration: a compile error where it initialises a `static`. A `const fn` cannot ask
    /// the backend, so a backend the configuration does not fit ([`Scheduler::new`]'s refusal) is not
    /// checked here: sliding-window KV groups, the one such backend, are not const-constructible.
    pub const fn new_const(cfg: Config, kv: K, peft: P) -> Self {
        assert!(
            cfg.validate().is_ok(),
            "invalid scheduler configuration (Config::validate)"
        );
        Self::inline(cfg, kv, peft)
    }

    const fn inline(cfg: Config, kv: K, peft: P) -> Self {
        Self {
            cfg,
            kv,
            desk: AdapterDesk::new(peft),
            table: Table::new(),
            scratch: Scratch::new(),
            stall: 0,
            blocked: super::priority::Records::NONE,
            passes: 0,
            completed: 0,
            last: PassStats::NONE,
            clients: Clients::new(),
            adapter_waits: InlineArray::new([0; N]),
            transfer_ends: TransferStats::NONE,
            incremental: true,
            steady: false,
            replays: 0,
            last_full: 0,
            delta_pass: 0,
            shown: heapless::Vec::new(),
            seen: InlineArray::new([crate::delta::Seen::NOWHERE; N]),
            run: super::refused_run::RefusedRun::NONE,
        }
    }
}

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Scheduler<K, P, N, T, S>
{
    /// A scheduler over the given backends, its arrays in storage `S` (with `Boxed`, each a heap
    /// allocation of its own, built in place). Refused for an invalid configuration, or when `S`
    /// cannot have the memory.
    pub fn new_in(cfg: Config, kv: K, peft: P) -> Result<Self, Error> {
        cfg.validate()?;
        fits(&cfg, &kv)?;
        Ok(Self {
            cfg,
            kv,
            desk: AdapterDesk::new_in(peft)?,
            table: Table::new_in()?,
            scratch: Scratch::new_in()?,
            stall: 0,
            blocked: super::priority::Records::NONE,
            passes: 0,
            completed: 0,
            last: PassStats::NONE,
            clients: Clients::new_in()?,
            adapter_waits: S::array(|| 0)?,
            transfer_ends: TransferStats::NONE,
            incremental: true,
            steady: false,
            replays: 0,
            last_full: 0,
            delta_pass: 0,
            shown: S::list(crate::output::Listed::EMPTY)?,
            seen: S::array(|| crate::delta::Seen::NOWHERE)?,
            run: super::refused_run::RefusedRun::NONE,
        })
    }
}

#[cfg(feature = "alloc")]
impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize>
    Scheduler<K, P, N, T, crate::storage::Boxed>
{
    /// [`Scheduler::new_in`] with every array on the heap: a scheduler of any `N` whose value is a few
    /// hundred bytes beside its backends, built without putting an array on the stack.
    pub fn boxed(cfg: Config, kv: K, peft: P) -> Result<Self, Error> {
        Self::new_in(cfg, kv, peft)
    }
}
