//! `--check`: the invariants of the scheduler and its pools (DESIGN.md §7), in a time that follows
//! what each iteration touched. After every iteration the *spot checks*: the rows of the requests the
//! pass listed and those the last step finished (a decode step's row tail only), their table entries
//! and their ownership's agreement with the pools, every pool's conservation from its counters (O(1)),
//! the adapter cache's residency and page conservation and, per task, the desk's leases against the
//! cache's count (O(adapters)), and the output's own invariants (no request listed twice, the token
//! budget, the batch limit). Every `audit_every` iterations (`--check-every`, default
//! [`DEFAULT_AUDIT_EVERY`]; `--check=full`: every iteration) and at the end of the run, the *exact
//! audit*: every page free once, in an adapter's chain once, or held with a reference count equal to
//! the table entries naming it; every index entry a cached block, every child count right — O(pages),
//! over one scratch buffer kept for the run — and the whole request table (every entry, the leases per
//! task counted from the requests). Neither allocates after the first audit.
//!
//! What each catches, as designed (shown by the planted faults of this file's tests): a page both
//! free and held, a lease never returned, a row naming a page that does not exist or a host page while
//! active, in the iteration it happens; a reference count off by one or an orphaned index entry, at the
//! next exact audit.

use kvsched_core::ids::TaskSlot;
use kvsched_core::output::Listed;

use super::backend::SimKv;
use super::{Out, Sched, SimOptions, MAX_LIVE};

/// Iterations between two exact audits under `--check` unless `--check-every` says otherwise.
pub const DEFAULT_AUDIT_EVERY: u64 = 1000;

/// One engine's checks, with their scratch space.
#[derive(Debug)]
pub(crate) struct Checker {
    audit_every: u64,
    since_audit: u64,
    /// The exact audit's count per page (grown once).
    scratch: Vec<u32>,
    /// The table slots the pass listed, a bit each (cleared every iteration).
    seen: Vec<u64>,
    /// The last iteration ran the exact audit.
    audited: bool,
    /// Exact audits run.
    pub(crate) audits: u64,
}

impl Checker {
    /// The checks `o` asks for (`None`: no `--check`).
    pub(crate) fn new(o: &SimOptions) -> Option<Self> {
        o.check.then(|| Self {
            audit_every: o.check_every.max(1),
            since_audit: 0,
            scratch: Vec::new(),
            seen: vec![0; MAX_LIVE.div_ceil(64)],
            audited: false,
            audits: 0,
        })
    }

    /// The checks after an iteration whose pass produced `out`; returns how many failed.
    pub(crate) fn iteration<'a, K: SimKv<'a>>(
        &mut self,
        s: &Sched<'a, K>,
        out: &Out,
        o: &SimOptions,
        finished: &[u16],
    ) -> u64 {
        let mut bad = self.spot(s, out, o, finished);
        self.since_audit += 1;
        self.audited = self.since_audit >= self.audit_every;
        if self.audited {
            bad += self.audit(s);
        }
        bad
    }

    /// Whether the last iteration ran the exact audit (the cluster then audits the router's view).
    pub(crate) fn audited(&self) -> bool {
        self.audited
    }

    /// The exact audit of the pools and the scheduler's table; returns how many failed.
    pub(crate) fn audit<'a, K: SimKv<'a>>(&mut self, s: &Sched<'a, K>) -> u64 {
        self.since_audit = 0;
        self.audits += 1;
        s.kv().audit_failures(&mut self.scratch) + u64::from(!s.check())
    }

    /// The spot checks: what the iteration touched, the counters, the output.
    fn spot<'a, K: SimKv<'a>>(
        &mut self,
        s: &Sched<'a, K>,
        out: &Out,
        o: &SimOptions,
        finished: &[u16],
    ) -> u64 {
        // A decode step touched its row's tail only; a resumed request is listed beside its batch.
        let listed = batch(out).map(|(l, decode)| (l.slot(), decode));
        let resumed = out.resumed().iter().map(|l| (l.slot(), false));
        let gone = finished.iter().map(|&slot| (slot, false));
        let touched = listed.chain(resumed).chain(gone);
        let mut bad = s.kv().spot_failures(touched.clone());
        // The touched requests' table entries, and their ownership = the pools'.
        bad += u64::from(!s.check_requests(touched.map(|(slot, _)| slot)));
        bad += adapter_failures(s);
        bad + self.output_failures(out, o)
    }

    /// The output's invariants: no table slot listed twice, the token budget, the batch limit.
    fn output_failures(&mut self, out: &Out, o: &SimOptions) -> u64 {
        self.seen.fill(0);
        let mut bad = 0;
        for (l, _) in batch(out) {
            let (word, bit) = (usize::from(l.slot()) / 64, 1u64 << (l.slot() % 64));
            match self.seen.get_mut(word) {
                Some(w) if *w & bit == 0 => *w |= bit,
                _ => bad += 1,
            }
        }
        // A decode step costs one token plus its drafts; a last chunk's drafts may overdraw (upstream).
        let drafts = u64::from(o.spec_decode.map_or(0, |s| s.drafts));
        let tokens: u64 = out.context().iter().map(|c| c.tokens as u64).sum::<u64>()
            + out.generation().len() as u64 * (1 + drafts);
        let overdraw = out.context().iter().filter(|c| c.last).count() as u64 * drafts;
        bad += u64::from(tokens > o.max_tokens as u64 + overdraw);
        bad + u64::from(out.generation().len() + out.context().len() > o.max_batch as usize)
    }
}

/// Every request the pass listed in its batch or set aside (a slot at most once), and whether it is a
/// decode step.
fn batch(out: &Out) -> impl Iterator<Item = (&Listed, bool)> + Clone {
    let contexts = out.context().iter().map(|c| &c.listed);
    let others = out
        .encoder()
        .iter()
        .chain(out.paused())
        .chain(out.recompute_paused());
    let decodes = out.generation().iter().map(|l| (l, true));
    contexts
        .chain(others)
        .chain(out.disagg())
        .map(|l| (l, false))
        .chain(decodes)
}

/// The adapter cache's residency and page conservation, and per task the desk's leases = the cache's
/// active count; returns how many failed. O(adapters).
fn adapter_failures<'a, K: SimKv<'a>>(s: &Sched<'a, K>) -> u64 {
    let pool = s.adapters().backend();
    let leases = pool.tasks().iter().enumerate().filter(|(slot, t)| {
        s.adapters()
            .leases(TaskSlot(u16::try_from(*slot).unwrap_or(u16::MAX)))
            != t.active
    });
    leases.count() as u64 + u64::from(!pool.check())
}

/// A digest of one pass for the differential check: its output (every list in order, the chunks, the
/// adapter plan and loads, O(batch)); when `state`, the scheduler's own state
/// ([`kvsched_core::Scheduler::fingerprint`], O(table): every `--check-every` passes); when `pools`,
/// every page and row of the lead pool ([`kvsched_core::KvPool::fingerprint`], O(pages + rows): at
/// the end of the run).
pub(crate) fn pass_digest<'a, K: SimKv<'a>>(
    s: &Sched<'a, K>,
    out: &Out,
    state: bool,
    pools: bool,
) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = kvsched_core::fingerprint::Fingerprint::new();
    out.context().hash(&mut h);
    for list in [
        out.generation(),
        out.encoder(),
        out.paused(),
        out.recompute_paused(),
        out.disagg(),
        out.resumed(),
    ] {
        list.hash(&mut h);
    }
    out.adapters().hash(&mut h);
    out.adapter_loads().hash(&mut h);
    out.pass().hash(&mut h);
    s.stall_count().hash(&mut h);
    if state {
        s.fingerprint().hash(&mut h);
    }
    if pools {
        s.kv().lead().fingerprint().hash(&mut h);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use kvsched_core::ids::TaskSlot;
    use kvsched_core::page_pool::PoolFault;

    use crate::disagg::Role;
    use crate::{prepare, Replica, SimOptions};

    /// An invariant broken on purpose.
    #[derive(Debug, Clone, Copy)]
    enum Fault {
        Pool(PoolFault),
        KeptLease,
    }

    /// Exact audits every 10 iterations; the fault goes in after iteration 125, so that the next
    /// iteration's spot checks come before the audit of iteration 130.
    const EVERY: u64 = 10;
    const PLANT_AFTER: u64 = 125;

    /// Replays the shipped slice under `--check --check-every 10` with `fault` planted after iteration
    /// 125; returns the violations counted by then, after the next iteration, and after the next audit.
    fn violations(fault: Option<Fault>) -> [u64; 3] {
        let mut o = SimOptions {
            check: true,
            check_every: EVERY,
            progress: false,
            ..SimOptions::default()
        };
        o.adapters.count = 8;
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/azure_conv_head.csv");
        let mut w = kvsched_workload::load(path).expect("the shipped slice loads");
        w.arrivals.truncate(300);
        prepare(&o, &mut w).expect("the workload is prepared");
        let mut e = Replica::new(&o, &w).expect("the engine's geometry");
        let mut sim = e.sim(&o, &w, None, Role::Mixed).expect("the engine");
        let step_to = |sim: &mut crate::run_loop::Sim<'_, '_>, n: u64| {
            while sim.figures().iterations < n {
                assert!(
                    sim.step().expect("a step"),
                    "the run lasts past {n} iterations"
                );
            }
            sim.figures().invariant_violations
        };
        let before = step_to(&mut sim, PLANT_AFTER);
        let planted = match fault {
            None => true,
            Some(Fault::Pool(f)) => sim.sched_mut().plant(f),
            Some(Fault::KeptLease) => sim.sched_mut().plant_kept_lease(TaskSlot(0)),
        };
        assert!(planted, "{fault:?} found what it breaks");
        let next = step_to(&mut sim, PLANT_AFTER + 1);
        let audited = step_to(&mut sim, PLANT_AFTER.next_multiple_of(EVERY));
        [before, next, audited]
    }

    #[test]
    fn a_clean_run_counts_no_violation() {
        assert_eq!(violations(None), [0, 0, 0]);
    }

    #[test]
    fn a_page_both_free_and_held_is_caught_in_the_iteration_it_happens() {
        let [before, next, _] = violations(Some(Fault::Pool(PoolFault::FreeAndHeld)));
        assert_eq!(before, 0);
        assert!(next > 0, "the counters' conservation fails at once");
    }

    #[test]
    fn a_lease_not_returned_is_caught_in_the_iteration_it_happens() {
        let [before, next, _] = violations(Some(Fault::KeptLease));
        assert_eq!(before, 0);
        assert!(
            next > 0,
            "the desk's leases disagree with the cache's count at once"
        );
    }

    #[test]
    fn a_reference_count_off_by_one_is_caught_by_the_next_exact_audit() {
        let [before, next, audited] = violations(Some(Fault::Pool(PoolFault::ExtraRef)));
        assert_eq!([before, next], [0, 0], "no spot check counts references");
        assert!(audited > 0, "the audit counts the rows naming each page");
    }

    #[test]
    fn an_orphaned_index_entry_is_caught_by_the_next_exact_audit() {
        let [before, next, audited] = violations(Some(Fault::Pool(PoolFault::OrphanIndexEntry)));
        assert_eq!([before, next], [0, 0], "no spot check walks the index");
        assert!(audited > 0, "the audit counts the index's entries");
    }
}
