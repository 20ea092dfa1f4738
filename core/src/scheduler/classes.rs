//! Service classes ([`crate::Config::shares`], beyond the reference; issue 45): a latency class is never
//! starved by a throughput class's backlog.
//!
//! Each request has a class ([`crate::RequestSpec::class`]); each class may have a share
//! ([`crate::config::Share`]) of three resources, each counted over the class's requests on the GPU:
//! batch slots, KV tokens (the prompt tokens they computed) and adapter pages (of their distinct
//! adapters). A share is
//! not set aside: while its class has nothing waiting, the other classes use it (it is lent). When a
//! pass refuses a request a resource — a batch slot, pages (after context-side preemption freed
//! none), its adapter — and, admitted, it would keep its class within its share of that resource, the
//! refusal is a claim (recorded as a [`Blocked`], the first a pass meets). A request larger than its
//! class's share claims nothing: it runs, when there is room, as a borrower. The next pass honours it while the
//! request still waits and its class is still short:
//!
//! - no request of a class at or above its share of the resource is admitted, replayed or resumed in
//!   the pass (for adapter pages: no new LoRA request of such a class). Its requests on the GPU go on,
//!   and its LoRA requests admitted before: held, they could only keep what they hold (a request
//!   mid-prefill under GUARANTEED_NO_EVICT, an adapter a recompute-paused request keeps on the device:
//!   two wedges the model tests found);
//! - for a batch slot or KV, one running request of a class above its share (a borrower) yields, as a
//!   victim of priority does (`priority.rs`: suspended; never one in a transfer; the lowest priority
//!   first, the newest first within it), where a lower tier takes its pages, and never a LoRA request
//!   (its adapter stays paused on the device: one admitted beside it in the pass could not be loaded,
//!   found at 20,000 model cases). Without a lower tier nothing yields to a class: recompute-pausing
//!   borrowers for a claimant that still did not fit livelocked the model tests twice. Where no
//!   borrower yields, nothing is held either (holds could only wedge the pool: a deadlock the
//!   simulator found). For adapter pages nothing yields (a yield for an adapter over-commits the
//!   device, `priority.rs`): the borrowers' adapters come free as their requests finish, and nothing
//!   is held while no lease holder pins one;
//! - once the claimant is admitted, while its prompt is not done, the holds stay.
//!
//! A claim protects admission, not residence: once admitted, a claimant's KV is the ladder's by the
//! reference's rules (the newest first). Sparing a class within its share from the ladder was tried
//! and removed: with a small or no lower tier, a spared request's neighbours evicted each other for
//! ever (two livelocks the model tests found), and in the simulator it moved little (docs/ADMISSION.md).
//!
//! Within a class, and among classes within their shares, the order is the admission policy's. Under
//! GUARANTEED_NO_EVICT nothing yields (it promises no eviction) and a page shortage closes admissions
//! instead of claiming (`chunking.rs`): claims there are for batch slots and adapters, and hold.
//!
//! Progress: a claim stands only while its request fits its class's share, and each pass it stands one
//! borrower yields (or, for adapters, the borrowers' leases run out), so a class within its share waits
//! only for what the borrowers took; a borrowing class waits only while a class short of its share has
//! a request waiting. Two classes cannot take turns: a victim's class is above its share, so its
//! request cannot claim its room back (it would not fit the share), and a claimant, admitted within
//! its share, is no borrower. The shares of batch slots are checked against the batch (`Config::validate`);
//! the others are the operator's to size against the pools.

use crate::adapter::PeftBackend;
use crate::config::{CapacityPolicy, Share, SERVICE_CLASSES};
use crate::kv::KvBackend;
use crate::request::Ownership;
use crate::storage::Storage;

use super::marks::Mark;
use super::pass::Pass;
use super::priority::{Blocked, Need};

/// A claim honoured in a pass: its class, the resource, and the classes it holds back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim {
    need: Need,
    /// Per class: another class at or above its share of the resource (held back).
    full: [bool; SERVICE_CLASSES],
    record: Blocked,
}

impl Claim {
    /// The record it honours.
    pub(crate) fn record(self) -> Blocked {
        self.record
    }
}

/// Per resource (a [`Need`] as an index) and class, what the class's requests on the GPU use.
pub(crate) type Usage = [[u64; SERVICE_CLASSES]; 3];

/// The resources a share covers.
const NEEDS: [Need; 3] = [Need::Slot, Need::Pages, Need::Adapter];

/// Class `c` uses more than one of its shares (of those it has).
fn over(shares: &[Share; SERVICE_CLASSES], c: usize, u: &Usage) -> bool {
    NEEDS.iter().any(|&n| {
        let share = amount(shares[c], n);
        share > 0 && u[n as usize][c] > share
    })
}

/// Class `d` is a borrower of `need`'s resource: it uses more than its share of it, and it has no
/// share at all or uses more than one of those it has. (A class within every share it has is no
/// victim, so two classes with shares of different resources cannot take turns taking them back.)
fn borrower(shares: &[Share; SERVICE_CLASSES], d: usize, need: Need, u: &Usage) -> bool {
    let reserves = NEEDS.iter().any(|&n| amount(shares[d], n) > 0);
    u[need as usize][d] > amount(shares[d], need) && (!reserves || over(shares, d, u))
}

/// A share's amount of `need`'s resource.
fn amount(share: Share, need: Need) -> u64 {
    u64::from(match need {
        Need::Slot => share.requests,
        Need::Pages => share.kv_tokens,
        Need::Adapter => share.adapter_pages,
    })
}

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// Per resource and class, what the class's requests on the GPU use, as the pass's first need of
    /// it found them: one scan of the table a pass, however many refusals ask (a claim read from
    /// it is checked again, fresh, by the pass that honours it).
    fn usage(&mut self) -> Usage {
        if let Some(u) = self.holds.usage {
            return u;
        }
        let u = self.scan_usage();
        self.holds.usage = Some(u);
        u
    }

    /// [`Self::usage`]'s scan.
    fn scan_usage(&self) -> Usage {
        let mut u = [[0u64; SERVICE_CLASSES]; 3];
        let mut seen = [[false; T]; SERVICE_CLASSES];
        for &slot in self.table.order() {
            let e = self.table.entry(slot);
            if !e.ownership().on_gpu() {
                continue;
            }
            let s = e.spec();
            let c = usize::from(s.class);
            u[Need::Slot as usize][c] += 1;
            u[Need::Pages as usize][c] += u64::from(s.position);
            let Some(t) = e.task() else {
                continue;
            };
            if let Some(seen) = seen[c].get_mut(t.slot.index()).filter(|seen| !**seen) {
                *seen = true;
                u[Need::Adapter as usize][c] += u64::from(self.desk.known_pages(t.slot));
            }
        }
        u
    }

    /// What the request at `slot` takes of `need`'s resource once admitted.
    fn demand(&self, slot: u16, need: Need) -> u64 {
        let e = self.table.entry(slot);
        let s = e.spec();
        // On the GPU, what it holds is counted already; off it, its whole prompt comes back (a
        // reused prefix counts for each request, as in `usage`).
        let on_gpu = e.ownership().on_gpu();
        match need {
            Need::Slot => u64::from(!on_gpu),
            Need::Pages if on_gpu => u64::from(s.prompt - s.position),
            Need::Pages => u64::from(s.prompt),
            Need::Adapter => e
                .task()
                .map_or(0, |t| u64::from(self.desk.known_pages(t.slot))),
        }
    }

    /// The request at `slot` may claim `need`'s resource (by `u`, what the classes use now): its class
    /// has a share of it that, admitted, it keeps within, and is within every other share it has.
    fn within(&self, slot: u16, need: Need, u: &Usage) -> bool {
        let Some(shares) = self.cfg.shares else {
            return false;
        };
        let c = usize::from(self.table.entry(slot).spec().class);
        let share = amount(shares[c], need);
        share > 0 && u[need as usize][c] + self.demand(slot, need) <= share && !over(&shares, c, u)
    }

    /// A pass refused the request at `slot` `need`: a claim for the next pass if, admitted, it keeps
    /// its class within its share of it (the first claim a pass meets).
    pub(crate) fn note_claim(&mut self, slot: u16, need: Need) {
        if self.cfg.shares.is_none() || self.blocked.class.is_some() {
            return;
        }
        let u = self.usage();
        if self.within(slot, need, &u) {
            let b = self.record(slot, need);
            self.blocked.class = Some(b);
            // The rest of the pass holds back the classes at or above their shares already (for an
            // adapter, while a lease holder pins one).
            let pinned = need != Need::Adapter || self.desk.pinned_pages() > 0;
            if self.holds.claim.is_none() && pinned {
                self.hold_for(b, &u);
            }
        }
    }

    /// Holds back, for the claim `b`, the other classes at or above their shares of its resource (by
    /// `u`).
    fn hold_for(&mut self, b: Blocked, u: &Usage) {
        let Some(shares) = self.cfg.shares else {
            return;
        };
        let class = usize::from(self.table.entry(b.slot).spec().class);
        let used = u[b.need as usize];
        let full = core::array::from_fn(|c| c != class && used[c] >= amount(shares[c], b.need));
        self.holds.claim = Some(Claim {
            need: b.need,
            full,
            record: b,
        });
    }

    /// A phase found the batch full: the first request that waits, not scheduled, not held back,
    /// whose lease would be had and whose class is short of its share of batch slots, claims one.
    #[cold]
    pub(crate) fn claim_slot(&mut self) {
        if self.cfg.shares.is_none() || self.blocked.class.is_some() {
            return;
        }
        let u = self.usage();
        let passed =
            |p: &Self, s: u16| p.marked(s, Mark::PREEMPTED) || p.marked(s, Mark::SCHEDULED);
        let short = self.table.order().iter().copied().find(|&s| {
            self.within(s, Need::Slot, &u)
                && self.waits(s)
                && !passed(self, s)
                && !self.held_back(s)
                && self.lease_obtainable(s)
        });
        if let Some(s) = short {
            let b = self.record(s, Need::Slot);
            self.blocked.class = Some(b);
            if self.holds.claim.is_none() {
                self.hold_for(b, &u);
            }
        }
    }

    /// Phase 1 at arrival index `i`: the request at `slot`, off the GPU, that may not claim a batch
    /// slot (its class at or above its share of them, or above another share), would take a slot
    /// that a running request after it, of a class within its share, needs (a resumed borrower
    /// would displace a claimant it yielded to). Never a record's own request.
    #[cold]
    pub(crate) fn displaces(&mut self, i: usize, slot: u16) -> bool {
        let Some(shares) = self.cfg.shares else {
            return false;
        };
        if self.table.entry(slot).ownership().on_gpu() || self.claimant(slot) {
            return false;
        }
        let u = self.usage();
        if self.within(slot, Need::Slot, &u) {
            return false;
        }
        let used = u[Need::Slot as usize];
        let protected = |c: u8| used[usize::from(c)] <= amount(shares[usize::from(c)], Need::Slot);
        let order = self.table.order();
        let after = order.iter().skip(i + 1).filter(|&&s| {
            let e = self.table.entry(s);
            let running = e.ownership().on_gpu() && e.spec().phase.is_generation();
            running && protected(e.spec().class)
        });
        let left = self
            .cfg
            .max_num_requests
            .saturating_sub(self.budget.requests());
        left as usize <= after.count()
    }

    /// Before phase 1 (after priority's record): the last pass's claim, while its request still waits
    /// and its class is still short, holds back the classes at or above their shares and, for a batch
    /// slot or KV, makes one borrower yield.
    pub(crate) fn honour_claim(&mut self) {
        let (Some(b), Some(shares)) = (self.blocked.class.take(), self.cfg.shares) else {
            return;
        };
        if self.standing(b).is_none() {
            return;
        }
        let class = usize::from(self.table.entry(b.slot).spec().class);
        let u = self.usage();
        // Admitted (and still finishing), its own use counts already.
        if !b.admitted && !self.within(b.slot, b.need, &u) {
            return;
        }
        let room = b.need != Need::Adapter && !b.admitted;
        // Only by suspension: recompute-pausing borrowers for a claimant that then still did not fit
        // livelocked the model tests twice (the borrowers replayed for ever).
        let suspends = self.kv.limits().can_evict;
        if room && self.cfg.policy == CapacityPolicy::MaxUtilization && suspends {
            // Never a LoRA request: its suspended lease leaves its adapter paused on the device, and an
            // adapter the pass admitted beside it could not be loaded (found at 20,000 model cases).
            let borrower = move |p: &Self, s: u16| {
                let e = p.table.entry(s);
                let c = usize::from(e.spec().class);
                c != class && e.task().is_none() && borrower(&shares, c, b.need, &u)
            };
            if !self.yield_where(b.slot, borrower) {
                // No borrower to take it back from: holding the others back could only wedge the
                // pool (a deadlock the simulator found).
                return;
            }
            // The victim's use is gone: the pass reads it again when it next needs it.
            self.holds.usage = None;
        } else if room && self.cfg.policy == CapacityPolicy::MaxUtilization {
            return;
        }
        if b.need == Need::Adapter && self.desk.pinned_pages() == 0 {
            // No lease holder's adapter will come free.
            return;
        }
        self.hold_for(b, &u);
    }

    /// After phase 2: a claimant admitted this pass whose prompt is not done keeps its holds next
    /// pass, unless a new claim was recorded.
    pub(crate) fn keep_claim(&mut self) {
        let kept = self.holds.claim.and_then(|c| self.finishing(c.record));
        if self.blocked.class.is_none() {
            self.blocked.class = kept;
        }
    }

    /// The request at `slot` is held back by this pass's claim: of a class at or above its share, off
    /// the GPU (a request on it could only keep what it holds: it yields instead), not a suspended one
    /// whose pages stay on the GPU; a LoRA request only while new (a suspended or recompute-paused
    /// one may keep its adapter on the device), and for adapter pages only a new LoRA request.
    pub(crate) fn claim_holds(&self, slot: u16) -> bool {
        let Some(claim) = self.holds.claim else {
            return false;
        };
        let e = self.table.entry(slot);
        let new = e.ownership() == Ownership::Waiting;
        let held = match (claim.need, e.task()) {
            (Need::Adapter, task) => new && task.is_some(),
            (_, None) => !e.ownership().on_gpu() && self.holdable(slot),
            (_, Some(_)) => new,
        };
        held && claim.full[usize::from(e.spec().class)]
    }
}
