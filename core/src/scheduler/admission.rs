//! The order of phase 2's admissions ([`Admission`], beyond the reference) and the virtual token
//! counters behind [`Admission::Vtc`].
//!
//! FCFS keeps the pending list in arrival order and does nothing here. The other policies give each
//! waiting request a key and sort the list by (key, arrival index) before phase 2 plans and admits:
//! O(P log P) for P pending requests, no allocation (the sort is in place; the per-client sums live in
//! the scheduler's scratch). Requests admitted once (a later chunk, a suspended or a recompute-paused
//! request) keep arrival order ahead of the waiting ones. The drain that keeps a blocked adapter from
//! starving is in `context.rs` (`adapter_refused`).
//!
//! - `Deadline`: the key is the request's absolute TTFT deadline, `arrival + ttft[priority]`.
//! - `Priority`: the key is the request's priority, a request admitted before ahead of a waiting
//!   one within it (`priority.rs`: priority that preempts).
//! - `Vtc`: the key is the client's counter plus the input-weighted remaining prompts of the client's
//!   requests ahead of this one in the list, so one pass interleaves clients as VTC's one-at-a-time
//!   selection would, instead of serving the least-served client's whole backlog first.
//!
//! Counters are charged when the engine completes a step ([`Clients::charge`], from
//! `Scheduler::complete_step`): a context chunk's tokens at the input weight, a generation step's
//! tokens (its beam and its draft tokens) at the output weight. A client joins when its first live request
//! is submitted and is then lifted to the smallest counter among the clients with live requests; it is
//! remembered after its last request leaves until its entry is needed for a new client (the one with the
//! smallest counter goes first), so a returning client keeps the service it had.

use crate::adapter::PeftBackend;
use crate::config::Admission;
use crate::kv::KvBackend;
use crate::request::{Ownership, RequestSpec};
use crate::storage::{Inline, InlineArray, Storage};

use super::pass::Pass;
use crate::narrow::u16_of;

/// A client's identity: a tenant, a LoRA task, or the base model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
enum Client {
    #[default]
    Base,
    Task(u64),
    Tenant(u32),
}

impl Client {
    fn of(spec: &RequestSpec) -> Self {
        match (spec.tenant, spec.lora) {
            (Some(t), _) => Self::Tenant(t),
            (None, Some(task)) => Self::Task(task.0),
            (None, None) => Self::Base,
        }
    }
}

/// The VTC counters: at most `N` clients (a table of `N` requests has at most `N` live ones).
pub(crate) struct Clients<const N: usize, S: Storage = Inline> {
    client: S::Array<Client, N>,
    counter: S::Array<u64, N>,
    /// Live requests of the client; 0 for a remembered one.
    live: S::Array<u32, N>,
    /// Entries in use (live or remembered).
    known: usize,
    /// The client entry of each table slot (meaningful for live slots only).
    of_slot: S::Array<u16, N>,
}

impl<const N: usize> Clients<N> {
    pub(crate) const fn new() -> Self {
        Self {
            client: InlineArray::new([Client::Base; N]),
            counter: InlineArray::new([0; N]),
            live: InlineArray::new([0; N]),
            known: 0,
            of_slot: InlineArray::new([0; N]),
        }
    }
}

impl<const N: usize, S: Storage> Clients<N, S> {
    pub(crate) fn new_in() -> Result<Self, crate::Error> {
        Ok(Self {
            client: S::array(|| Client::Base)?,
            counter: S::array(|| 0)?,
            live: S::array(|| 0)?,
            known: 0,
            of_slot: S::array(|| 0)?,
        })
    }

    /// A request entered table slot `slot`: its client gains a live request (joining, and lifted to
    /// the active clients' smallest counter, when it had none).
    pub(crate) fn join(&mut self, slot: u16, spec: &RequestSpec) {
        let who = Client::of(spec);
        let at = match self.client[..self.known].iter().position(|&c| c == who) {
            Some(at) => at,
            None => self.make_room(who),
        };
        if self.live[at] == 0 {
            let floor = (0..self.known)
                .filter(|&i| self.live[i] > 0)
                .map(|i| self.counter[i])
                .min();
            if let Some(floor) = floor {
                self.counter[at] = self.counter[at].max(floor);
            }
        }
        self.live[at] += 1;
        self.of_slot[slot as usize] = u16_of(at);
    }

    /// An entry for a new client: a free one, else the remembered client with the smallest counter's.
    fn make_room(&mut self, who: Client) -> usize {
        let at = if self.known < N {
            self.known += 1;
            self.known - 1
        } else {
            let idle = (0..N).filter(|&i| self.live[i] == 0);
            // The joining request's slot is taken, so at most N - 1 clients have live requests.
            let at = idle.min_by_key(|&i| self.counter[i]);
            at.expect("a table of N requests has at most N - 1 other live clients")
        };
        self.client[at] = who;
        self.counter[at] = 0;
        self.live[at] = 0;
        at
    }

    /// The request in `slot` left the table.
    pub(crate) fn leave(&mut self, slot: u16) {
        let at = self.of_slot[slot as usize] as usize;
        debug_assert!(self.live[at] > 0);
        self.live[at] = self.live[at].saturating_sub(1);
    }

    /// The request in `slot` received `service` weighted tokens.
    pub(crate) fn charge(&mut self, slot: u16, service: u64) {
        let at = self.of_slot[slot as usize] as usize;
        self.counter[at] = self.counter[at].saturating_add(service);
    }

    /// The counter of the client of the request in `slot`.
    pub(crate) fn counter_of(&self, slot: u16) -> u64 {
        self.counter[self.of_slot[slot as usize] as usize]
    }

    /// The client entry of the request in `slot`.
    fn entry_of(&self, slot: u16) -> usize {
        self.of_slot[slot as usize] as usize
    }

    /// Hashes the counters (the scheduler's fingerprint).
    pub(crate) fn hash_state<H: core::hash::Hasher>(&self, h: &mut H) {
        use core::hash::Hash;
        self.client[..self.known].hash(h);
        self.counter[..self.known].hash(h);
        self.live[..self.known].hash(h);
    }
}

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// Orders the pending list by the admission policy (FCFS: left in arrival order). A policy orders
    /// only new admissions: requests already admitted once (a later chunk, a suspended or a
    /// recompute-paused request) keep arrival order ahead of the waiting ones, as under FCFS, so a
    /// policy never makes two partially prefilled requests take turns preempting each other.
    pub(crate) fn order_admissions(&mut self) {
        debug_assert!(
            self.no_span() || self.cfg.admission == Admission::Fcfs,
            "runs apply under FCFS admission only"
        );
        match self.cfg.admission {
            Admission::Fcfs => return,
            Admission::Deadline { ttft } => {
                for p in self.pending.iter_mut() {
                    let e = self.table.entry(self.table.slot(p.index as usize));
                    let s = e.spec();
                    let class = ttft[usize::from(s.priority)];
                    p.key = new_admission(e.ownership(), s.arrival.saturating_add(class));
                }
            }
            Admission::Priority => {
                for p in self.pending.iter_mut() {
                    let e = self.table.entry(self.table.slot(p.index as usize));
                    p.key = by_priority(e.ownership(), e.spec().priority);
                }
            }
            Admission::Vtc { input_weight, .. } => {
                let ahead = &mut *self.client_sums;
                ahead[..self.clients.known].fill(0);
                for p in self.pending.iter_mut() {
                    let slot = self.table.slot(p.index as usize);
                    let e = self.table.entry(slot);
                    let s = e.spec();
                    let at = self.clients.entry_of(slot);
                    let queued = u64::from(input_weight).saturating_mul(ahead[at]);
                    let key = self.clients.counter_of(slot).saturating_add(queued);
                    p.key = new_admission(e.ownership(), key);
                    ahead[at] = ahead[at].saturating_add(u64::from(s.prompt - s.position));
                }
            }
        }
        self.pending.sort_unstable_by_key(|p| (p.key, p.index));
    }
}

/// A pending request's sort key under [`Admission::Priority`]: its priority, one admitted before
/// ahead of a waiting one within it (a victim keeps its place among its priority).
fn by_priority(ownership: Ownership, priority: u8) -> u64 {
    (u64::from(priority) << 1) | u64::from(ownership == Ownership::Waiting)
}

/// A pending request's sort key: 0 (arrival order, first) for one admitted before, `1 + key` for a
/// waiting one.
fn new_admission(ownership: Ownership, key: u64) -> u64 {
    match ownership {
        Ownership::Waiting => key.saturating_add(1),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use crate::adapter_pool::AdapterPool;
    use crate::config::{Admission, Config};
    use crate::ids::TaskId;
    use crate::output::SchedulerOutput;
    use crate::page_pool::KvPool;
    use crate::phase::Phase;
    use crate::request::RequestSpec;
    use crate::scheduler::{Handle, Scheduler};
    use crate::testing::Mem;

    type Sched<'a> = Scheduler<KvPool<'a>, AdapterPool<4>, 8, 4>;
    type Mem8 = Mem<64, 8, 8, 128, 128>;

    /// One context request's worth of budget a pass (prompts of 8 tokens, 8 tokens a pass).
    fn config(admission: Admission) -> Config {
        Config {
            max_num_tokens: Some(8),
            max_context_length: Some(8),
            admission,
            ..Config::default()
        }
    }

    fn sched(mem: &mut Mem8, admission: Admission, device_pages: u32) -> Sched<'_> {
        let mut peft = AdapterPool::new(device_pages, 8).unwrap();
        peft.register(TaskId(1), 1).unwrap();
        peft.register(TaskId(2), 1).unwrap();
        Scheduler::new(config(admission), mem.pool(0, 4), peft).unwrap()
    }

    fn prompt(id: u64, tokens: u32) -> RequestSpec {
        RequestSpec::new(id, Phase::ContextInit, tokens)
    }

    /// Runs passes (completing each step and removing finished requests) until every request has been
    /// admitted; returns the ids in the order of their first chunk.
    fn admission_order(s: &mut Sched<'_>, handles: &[Handle]) -> heapless::Vec<u64, 8> {
        let mut out = SchedulerOutput::<8>::new();
        let mut order = heapless::Vec::new();
        for _ in 0..64 {
            s.schedule(&mut out).unwrap();
            s.ensure_batch(&mut out).unwrap();
            let _ = s.take_moves();
            for c in out.context() {
                let id = s.get(c.listed.handle()).unwrap().spec().id.0;
                if !order.contains(&id) {
                    order.push(id).unwrap();
                }
            }
            s.complete_step(&out).unwrap();
            assert!(s.check());
            for &h in handles {
                if s.get(h)
                    .is_ok_and(|e| e.spec().phase == Phase::GenerationInProgress)
                {
                    s.remove(h).unwrap();
                }
            }
            if order.len() == handles.len() {
                break;
            }
        }
        order
    }

    #[test]
    fn deadline_admits_the_earliest_deadline_first() {
        let mut mem = Mem8::new();
        let ttft = [100, 1_000, 10_000, 100_000];
        let mut s = sched(&mut mem, Admission::Deadline { ttft }, 8);
        // (id, class, arrival): deadlines 100_000, 1_050, 10_020, 130.
        let reqs = [(1, 3, 0), (2, 1, 50), (3, 2, 20), (4, 0, 30)];
        let handles: heapless::Vec<Handle, 8> = reqs
            .iter()
            .map(|&(id, class, arrival)| {
                let mut r = prompt(id, 8);
                r.priority = class;
                r.arrival = arrival;
                s.submit(r).unwrap()
            })
            .collect();
        assert_eq!(admission_order(&mut s, &handles), [4, 2, 3, 1]);
        // A class out of range is refused at submission.
        let mut bad = prompt(9, 8);
        bad.priority = 4;
        assert!(s.submit(bad).is_err());
    }

    /// Tenant 0 queues three prompts before tenant 1's one; the order `admission` admits them in.
    fn tenant_order(admission: Admission) -> heapless::Vec<u64, 8> {
        let mut mem = Mem8::new();
        let mut s = sched(&mut mem, admission, 8);
        let handles: heapless::Vec<Handle, 8> = [(1, 0), (2, 0), (3, 0), (4, 1)]
            .iter()
            .map(|&(id, tenant)| {
                let mut r = prompt(id, 8);
                r.tenant = Some(tenant);
                s.submit(r).unwrap()
            })
            .collect();
        admission_order(&mut s, &handles)
    }

    #[test]
    fn fcfs_keeps_arrival_order() {
        assert_eq!(tenant_order(Admission::Fcfs), [1, 2, 3, 4]);
    }

    #[test]
    fn vtc_interleaves_a_backlogged_tenant_with_a_light_one() {
        // VTC serves tenant 1 second.
        assert_eq!(tenant_order(Admission::VTC), [1, 4, 2, 3]);
    }

    #[test]
    fn vtc_lifts_a_returning_client_to_the_active_minimum() {
        let mut mem = Mem8::new();
        let mut s = sched(&mut mem, Admission::VTC, 8);
        let mut out = SchedulerOutput::<8>::new();
        // Tenant 0 is served 8 prompt tokens (counter 8) while tenant 1 is absent.
        let mut a = prompt(1, 8);
        a.tenant = Some(0);
        let ha = s.submit(a).unwrap();
        let mut a2 = prompt(2, 8);
        a2.tenant = Some(0);
        s.submit(a2).unwrap();
        s.schedule(&mut out).unwrap();
        s.complete_step(&out).unwrap();
        s.remove(ha).unwrap();
        // Tenant 1 arrives: lifted to tenant 0's counter (8), so it earns no credit for being away; its
        // request ties with tenant 0's and arrival order decides.
        let mut b = prompt(3, 8);
        b.tenant = Some(1);
        s.submit(b).unwrap();
        let before = s.fingerprint();
        s.schedule(&mut out).unwrap();
        let first = s.get(out.context()[0].listed.handle()).unwrap().spec().id.0;
        assert_eq!(first, 2, "tied counters: the earlier arrival");
        assert_ne!(before, s.fingerprint());
    }

    /// SGLang #15129: a request whose adapter cannot get a device slot while requests of the resident
    /// adapter keep arriving. The device holds one adapter; adapter 1 is always in use by a running
    /// request. FCFS admits every new adapter-1 request and the adapter-2 request waits as long as they
    /// keep coming; a fair policy drains adapter 1 and loads adapter 2.
    fn blocked_adapter_waits(admission: Admission) -> Option<usize> {
        let mut mem = Mem8::new();
        let mut peft = AdapterPool::new(1, 8).unwrap();
        peft.register(TaskId(1), 1).unwrap();
        peft.register(TaskId(2), 1).unwrap();
        // Room for one prompt and the decodes each pass.
        let cfg = Config {
            max_num_tokens: Some(16),
            max_context_length: Some(16),
            drain_after: 4,
            ..config(admission)
        };
        let mut s: Sched<'_> = Scheduler::new(cfg, mem.pool(0, 4), peft).unwrap();
        let mut out = SchedulerOutput::<8>::new();
        let mut next = 10;
        let mut live: heapless::Vec<(Handle, u32), 8> = heapless::Vec::new();
        let r = prompt(1, 8).with_lora(1);
        live.push((s.submit(r).unwrap(), 0)).unwrap();
        let blocked = s.submit(prompt(2, 8).with_lora(2)).unwrap();
        for pass in 0..40 {
            // A new adapter-1 request arrives every pass while there is room.
            if s.len() < 7 {
                let mut r = prompt(next, 8).with_lora(1);
                r.arrival = pass;
                live.push((s.submit(r).unwrap(), 0)).unwrap();
                next += 1;
            }
            s.schedule(&mut out).unwrap();
            s.ensure_batch(&mut out).unwrap();
            let _ = s.take_moves();
            if out.context().iter().any(|c| c.listed.handle() == blocked) {
                return Some(pass as usize);
            }
            s.complete_step(&out).unwrap();
            // Generation requests finish after six steps.
            for (h, steps) in &mut live {
                if s.get(*h)
                    .is_ok_and(|e| e.spec().phase == Phase::GenerationInProgress)
                {
                    *steps += 1;
                }
            }
            live.retain(|&(h, steps)| {
                let done = steps >= 6;
                if done {
                    s.remove(h).unwrap();
                }
                !done
            });
        }
        None
    }

    #[test]
    fn a_fair_policy_drains_a_resident_adapter_for_a_blocked_one() {
        assert_eq!(
            blocked_adapter_waits(Admission::Fcfs),
            None,
            "FCFS starves it"
        );
        assert!(blocked_adapter_waits(Admission::VTC).is_some());
        let ttft = [1_000; 4];
        assert!(blocked_adapter_waits(Admission::Deadline { ttft }).is_some());
    }

    /// vLLM #53130: requests skipped for their adapter never count against the batch limit, so a
    /// mostly free cache keeps admitting behind them, under every policy.
    #[test]
    fn skipped_requests_leave_the_batch_limit_alone() {
        for admission in [
            Admission::Fcfs,
            Admission::VTC,
            Admission::Deadline { ttft: [0; 4] },
        ] {
            let mut mem = Mem8::new();
            let mut peft = AdapterPool::new(1, 8).unwrap();
            peft.register(TaskId(1), 1).unwrap();
            peft.register(TaskId(2), 1).unwrap();
            let cfg = Config {
                max_num_requests: 2,
                max_num_tokens: Some(64),
                max_context_length: Some(64),
                admission,
                ..Config::default()
            };
            let mut s: Sched<'_> = Scheduler::new(cfg, mem.pool(0, 4), peft).unwrap();
            let mut out = SchedulerOutput::<8>::new();
            // Adapter 1 takes the device; three adapter-2 requests cannot get it; then a base request.
            s.submit(prompt(1, 8).with_lora(1)).unwrap();
            for id in 2..5 {
                s.submit(prompt(id, 8).with_lora(2)).unwrap();
            }
            s.submit(prompt(5, 8)).unwrap();
            s.schedule(&mut out).unwrap();
            let mut admitted: heapless::Vec<u64, 8> = out
                .context()
                .iter()
                .map(|c| s.get(c.listed.handle()).unwrap().spec().id.0)
                .collect();
            admitted.sort_unstable(); // the output is in the LoRA sort's order (§1.13)
            assert_eq!(admitted, [1, 5], "{admission:?}");
        }
    }

    /// More clients over time than the table has slots: remembered clients give their entries up,
    /// least served first, and a refused submission changes nothing.
    #[test]
    fn vtc_remembers_at_most_n_clients_and_a_refusal_changes_nothing() {
        let mut mem = Mem8::new();
        let mut s = sched(&mut mem, Admission::VTC, 8);
        let mut out = SchedulerOutput::<8>::new();
        let mut live: heapless::Vec<Handle, 8> = heapless::Vec::new();
        for tenant in 0..40u32 {
            let mut r = prompt(u64::from(tenant), 8);
            r.tenant = Some(tenant % 13);
            live.push(s.submit(r).unwrap()).unwrap();
            s.schedule(&mut out).unwrap();
            s.complete_step(&out).unwrap();
            assert!(s.check());
            if live.len() == 7 {
                let h = live.remove(0);
                s.remove(h).unwrap();
            }
        }
        // A duplicate id is refused, and the counters are untouched.
        let before = s.fingerprint();
        let mut dup = prompt(39, 8);
        dup.tenant = Some(99);
        assert!(s.submit(dup).is_err());
        assert_eq!(before, s.fingerprint());
    }
}
