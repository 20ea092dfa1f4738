//! The KV connector at the pass boundary (`crate::connector`): before every pass the KV backend hands
//! over the loads that ended or failed, and the pass first recompute-pauses every request whose load
//! failed or timed out — its pages hold nothing usable, and neither does what its steps computed from
//! them, so it replays its prefill (listed in `recompute_paused`; the backend offers its replay nothing).
//! (The pending-load mark the reference's rules read is the engine's: `Scheduler::set_pending_load`.)

use crate::adapter::PeftBackend;
use crate::kv::{KvBackend, KvCaps, LoadChange, Transfers};
use crate::storage::{FixedList, Storage};

use super::pass::Pass;
use super::Scheduler;

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Scheduler<K, P, N, T, S>
{
    /// Takes the backend's load changes: the failed ones are left in the scratch for the pass.
    pub(crate) fn sync_loads(&mut self) {
        let (table, failed) = (&mut self.table, &mut self.scratch.pending_slots);
        failed.clear();
        let Some(transfers) = self.kv.transfers() else {
            return;
        };
        transfers.take_load_changes(&mut |slot, change| {
            if change == LoadChange::Failed && table.handle_at(slot).is_some() {
                let pushed = failed.push(slot);
                debug_assert!(pushed.is_ok(), "one change per slot");
            }
        });
    }
}

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// Recompute-pauses every request whose connector load failed or timed out (on the GPU, or
    /// suspended since). The load has ended: an engine's pending-load mark on it is cleared.
    pub(crate) fn abandon_failed_loads(&mut self) {
        for k in 0..self.failed_loads.len() {
            let slot = self.failed_loads[k];
            let holds = self.table.handle_at(slot).is_some()
                && matches!(
                    self.table.entry(slot).ownership(),
                    crate::request::Ownership::Active
                        | crate::request::Ownership::Resumed
                        | crate::request::Ownership::Paused
                );
            if holds {
                self.table.set_pending_load(slot, false);
                self.recompute(slot);
                self.stats.failed_loads += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use core::cell::RefCell;

    use crate::adapter::NoPeft;
    use crate::config::Config;
    use crate::connector::{KvConnector, LoadEnd};
    use crate::ids::RequestId;
    use crate::kv::KvRef;
    use crate::output::SchedulerOutput;
    use crate::page_pool::{ConnectorSlot, KvPool};
    use crate::phase::Phase;
    use crate::request::RequestSpec;
    use crate::scheduler::{Handle, Scheduler};
    use crate::testing::{Mem, PrefixMem};

    /// 32 GPU pages, 4 slots of 8 pages, 4 tokens a page.
    type Buf = Mem<32, 0, 4, 32, 32>;
    type Cache = PrefixMem<32, 64, 32>;
    type Sched<'a> = Scheduler<KvPool<'a>, NoPeft, 4, 4>;
    type Out = SchedulerOutput<4>;

    /// A store holding `blocks` blocks of every prompt; the test scripts the loads' ends and reads the
    /// log through the shared cell.
    #[derive(Default)]
    struct Store {
        blocks: u32,
        starts: heapless::Vec<(u64, u32, u32), 8>,
        cancels: heapless::Vec<u64, 8>,
        ends: heapless::Vec<(KvRef, LoadEnd), 8>,
        /// Accept saves (and log them: request, blocks, first block).
        saving: bool,
        saves: heapless::Vec<(u64, u32, u32), 8>,
        save_ends: heapless::Vec<KvRef, 8>,
    }

    struct Conn<'s>(&'s RefCell<Store>);

    impl KvConnector for Conn<'_> {
        fn matched_blocks(&mut self, _r: KvRef, _first: u32, _chain: u64, hashes: &[u64]) -> u32 {
            self.0.borrow().blocks.min(hashes.len() as u32)
        }
        fn start_load(&mut self, r: KvRef, pages: &[u32], first_block: u32) {
            let start = (r.id.0, pages.len() as u32, first_block);
            self.0.borrow_mut().starts.push(start).unwrap();
        }
        fn cancel_load(&mut self, r: KvRef) {
            self.0.borrow_mut().cancels.push(r.id.0).unwrap();
        }
        fn take_load_ends(&mut self, ended: &mut dyn FnMut(KvRef, LoadEnd)) {
            let ends = core::mem::take(&mut self.0.borrow_mut().ends);
            for (r, e) in ends {
                ended(r, e);
            }
        }
        fn start_save(&mut self, r: KvRef, pages: &[u32], first_block: u32) -> bool {
            let mut st = self.0.borrow_mut();
            if st.saving {
                let save = (r.id.0, pages.len() as u32, first_block);
                st.saves.push(save).unwrap();
            }
            st.saving
        }
        fn take_save_ends(&mut self, ended: &mut dyn FnMut(KvRef)) {
            let ends = core::mem::take(&mut self.0.borrow_mut().save_ends);
            for r in ends {
                ended(r);
            }
        }
    }

    struct Rig {
        b: Buf,
        c: Cache,
        slots: [ConnectorSlot; 4],
        saves: [u32; 32],
    }

    impl Rig {
        fn new() -> Self {
            Self {
                b: Buf::new(),
                c: Cache::new(),
                slots: [ConnectorSlot::default(); 4],
                saves: [0; 32],
            }
        }
        fn sched<'a>(&'a mut self, conn: &'a mut Conn<'_>, timeout: u32) -> Sched<'a> {
            let mut p = self.b.pool_with(0, 4, Some(&mut self.c));
            p.attach_connector(conn, &mut self.slots, &mut self.saves, timeout)
                .unwrap();
            Scheduler::new(Config::default(), p, NoPeft).unwrap()
        }
    }

    /// Submits a 20-token prompt (its first 4 blocks reusable) and runs one pass.
    fn admit(s: &mut Sched<'_>, out: &mut Out, id: u64) -> Handle {
        let spec = RequestSpec::new(id, Phase::ContextInit, 20);
        let h = s
            .submit_with_prefix(spec, 0, &[11, 12, 13, 14, 15])
            .unwrap();
        s.schedule(out).unwrap();
        h
    }

    /// Completes the last pass's step and runs the next.
    fn next(s: &mut Sched<'_>, out: &mut Out) {
        let _ = s.take_moves();
        s.complete_step(out).unwrap();
        s.schedule(out).unwrap();
        assert!(s.check());
    }

    fn offering(blocks: u32) -> RefCell<Store> {
        RefCell::new(Store {
            blocks,
            ..Store::default()
        })
    }

    fn ended(store: &RefCell<Store>, id: u64, slot: u16, end: LoadEnd) {
        let r = KvRef {
            slot,
            id: RequestId(id),
        };
        store.borrow_mut().ends.push((r, end)).unwrap();
    }

    #[test]
    fn an_offer_counts_as_reused_and_a_confirmed_load_joins_the_prefix_cache() {
        use crate::kv::Tier;
        let store = offering(3);
        let (mut rig, mut conn) = (Rig::new(), Conn(&store));
        let mut s = rig.sched(&mut conn, 8);
        let mut out = Out::new();
        let h = admit(&mut s, &mut out, 1);
        // Three 4-token blocks offered: the chunk is charged the other 8 tokens.
        assert_eq!(out.context()[0].tokens, 8);
        assert_eq!(s.get(h).unwrap().spec().position, 12);
        assert_eq!(store.borrow().starts.as_slice(), &[(1, 3, 0)]);
        assert_eq!(s.kv().unconfirmed_load(h.index()), Some((0, 3)));
        // Unconfirmed: the step's commit waits at the first loaded block.
        next(&mut s, &mut out);
        assert_eq!(s.kv().cached_pages(Tier::Gpu), 0);
        ended(&store, 1, h.index(), LoadEnd::Done);
        next(&mut s, &mut out);
        assert_eq!(s.kv().unconfirmed_load(h.index()), None);
        assert_eq!(
            s.kv().cached_pages(Tier::Gpu),
            5,
            "confirmed: the loaded and the computed blocks are committed"
        );
        let stats = s.kv().connector_stats().unwrap();
        assert_eq!((stats.offered_blocks, stats.loads, stats.failed), (3, 1, 0));
    }

    #[test]
    fn a_failed_load_is_recomputed_without_the_connector() {
        let store = offering(3);
        let (mut rig, mut conn) = (Rig::new(), Conn(&store));
        let mut s = rig.sched(&mut conn, 8);
        let mut out = Out::new();
        let h = admit(&mut s, &mut out, 1);
        ended(&store, 1, h.index(), LoadEnd::Failed);
        next(&mut s, &mut out);
        assert_eq!(
            out.recompute_paused().len(),
            1,
            "the failed load's request replays"
        );
        assert_eq!(s.last_pass().failed_loads, 1);
        assert_eq!(
            s.kv().cached_pages(crate::kv::Tier::Gpu),
            0,
            "nothing it wrote was cached"
        );
        let _ = h;
        // The replay computes its whole prompt: nothing offered, nothing loaded.
        next(&mut s, &mut out);
        assert_eq!(out.context()[0].tokens, 20);
        assert_eq!(store.borrow().starts.len(), 1);
    }

    #[test]
    fn a_load_that_never_ends_times_out_and_is_recomputed() {
        let store = offering(2);
        let (mut rig, mut conn) = (Rig::new(), Conn(&store));
        let mut s = rig.sched(&mut conn, 2);
        let mut out = Out::new();
        let h = admit(&mut s, &mut out, 1);
        next(&mut s, &mut out); // unconfirmed: 1 pass
        next(&mut s, &mut out); // 2 passes
        assert!(s.kv().unconfirmed_load(h.index()).is_some());
        assert!(out.recompute_paused().is_empty());
        next(&mut s, &mut out); // 3 > the timeout: abandoned
        assert_eq!(store.borrow().cancels.as_slice(), &[1]);
        assert_eq!(out.recompute_paused().len(), 1);
        assert_eq!(s.kv().connector_stats().unwrap().timed_out, 1);
        // A late end for the abandoned load changes nothing.
        ended(&store, 1, h.index(), LoadEnd::Done);
        next(&mut s, &mut out);
        assert_eq!(
            out.context()[0].tokens,
            20,
            "the replay computes everything"
        );
    }

    #[test]
    fn a_request_freed_while_loading_cancels_it_and_a_late_end_is_ignored() {
        let store = offering(3);
        let (mut rig, mut conn) = (Rig::new(), Conn(&store));
        let mut s = rig.sched(&mut conn, 8);
        let mut out = Out::new();
        let h = admit(&mut s, &mut out, 1);
        next(&mut s, &mut out);
        let slot = h.index();
        s.remove(h).unwrap();
        assert_eq!(store.borrow().cancels.as_slice(), &[1]);
        // Another request takes the slot and loads; the first one's late end names the old id.
        let _ = s.take_moves();
        s.complete_step(&out).unwrap();
        let h2 = admit(&mut s, &mut out, 2);
        assert_eq!(h2.index(), slot);
        ended(&store, 1, slot, LoadEnd::Failed);
        next(&mut s, &mut out);
        assert!(
            out.recompute_paused().is_empty(),
            "the late end was not request 2's"
        );
        assert_eq!(s.kv().unconfirmed_load(slot), Some((0, 3)));
    }

    #[test]
    fn a_connector_needs_the_prefix_cache_and_matching_slots() {
        let store = offering(1);
        let mut conn = Conn(&store);
        let mut b = Buf::new();
        let (mut slots, mut saves) = ([ConnectorSlot::default(); 4], [0u32; 32]);
        let mut p = b.pool(0, 4);
        assert!(p
            .attach_connector(&mut conn, &mut slots, &mut saves, 4)
            .is_err());
        let (mut b2, mut c2) = (Buf::new(), Cache::new());
        let (mut short, mut saves2) = ([ConnectorSlot::default(); 3], [0u32; 32]);
        let mut conn2 = Conn(&store);
        let mut p2 = b2.pool_with(0, 4, Some(&mut c2));
        assert!(p2
            .attach_connector(&mut conn2, &mut short, &mut saves2, 4)
            .is_err());
        assert!(p2.connector_stats().is_none(), "a refusal attaches nothing");
    }

    fn saving() -> RefCell<Store> {
        RefCell::new(Store {
            saving: true,
            ..Store::default()
        })
    }

    /// vLLM #39186, the save side: a request freed before its save is acknowledged. Its pages stay
    /// pinned (cached, not evictable) until the save ends, however late; then they are ordinary idle
    /// cached blocks. An end for a request the slot no longer holds a save of is ignored.
    #[test]
    fn a_save_pins_its_pages_past_the_request_until_it_ends() {
        use crate::kv::Tier;
        let store = saving();
        let (mut rig, mut conn) = (Rig::new(), Conn(&store));
        let mut s = rig.sched(&mut conn, 8);
        let mut out = Out::new();
        let h = admit(&mut s, &mut out, 1);
        next(&mut s, &mut out); // the chunk completes: its 5 blocks are committed and saved
        assert_eq!(store.borrow().saves.as_slice(), &[(1, 5, 0)]);
        let slot = h.index();
        s.remove(h).unwrap();
        assert_eq!(s.kv().cached_pages(Tier::Gpu), 5);
        assert_eq!(
            s.kv().idle_pages(Tier::Gpu),
            0,
            "pinned by the save: not evictable"
        );
        assert!(s.check() && s.kv().check());
        // A new request takes the slot; an end naming it changes nothing.
        let _ = s.take_moves();
        s.complete_step(&out).unwrap();
        let h2 = admit(&mut s, &mut out, 2);
        assert_eq!(h2.index(), slot);
        store
            .borrow_mut()
            .save_ends
            .push(KvRef {
                slot,
                id: RequestId(2),
            })
            .unwrap();
        next(&mut s, &mut out);
        assert_eq!(
            s.kv().idle_pages(Tier::Gpu),
            0,
            "request 2 holds the blocks now (it matched them), and the save still pins them"
        );
        // The late end of request 1's save unpins them.
        s.remove(h2).unwrap();
        store
            .borrow_mut()
            .save_ends
            .push(KvRef {
                slot,
                id: RequestId(1),
            })
            .unwrap();
        let _ = s.take_moves();
        s.complete_step(&out).unwrap();
        s.schedule(&mut out).unwrap();
        assert!(
            s.kv().idle_pages(Tier::Gpu) >= 5,
            "unpinned: idle and evictable again"
        );
        assert!(s.check() && s.kv().check());
    }

    /// vLLM #46014: a request preempted while a save of its blocks is in flight, then re-admitted with
    /// a hit on those blocks, loaded and saved them at once. Here the save pins them in the pool's own
    /// cache: the replay matches them there, the store is asked for nothing it would load into them.
    #[test]
    fn a_request_replayed_while_its_save_is_in_flight_finds_its_pinned_blocks() {
        let store = saving();
        store.borrow_mut().blocks = 4;
        let (mut rig, mut conn) = (Rig::new(), Conn(&store));
        let mut s = rig.sched(&mut conn, 8);
        let mut out = Out::new();
        let spec = RequestSpec::new(1, Phase::ContextInit, 20);
        let h = s
            .submit_with_prefix(spec, 0, &[21, 22, 23, 24, 25])
            .unwrap();
        s.schedule(&mut out).unwrap();
        // Nothing cached anywhere yet: the store offers its 4 blocks, they load, and are confirmed.
        assert_eq!(store.borrow().starts.len(), 1);
        ended(&store, 1, h.index(), LoadEnd::Done);
        next(&mut s, &mut out);
        next(&mut s, &mut out);
        assert_eq!(
            store.borrow().saves.len(),
            1,
            "the committed blocks are saved"
        );
        // Its cache is freed (as a preemption frees it) while the save is still in flight: its blocks
        // stay pinned in the cache. The request comes back (here as request 3, the same prompt).
        let _ = s.take_moves();
        s.complete_step(&out).unwrap();
        s.remove(h).unwrap();
        let again = RequestSpec::new(3, Phase::ContextInit, 20);
        let h3 = s
            .submit_with_prefix(again, 0, &[21, 22, 23, 24, 25])
            .unwrap();
        s.schedule(&mut out).unwrap();
        assert_eq!(
            out.context()[0].tokens,
            4,
            "16 tokens matched in the pool, not loaded"
        );
        assert_eq!(
            store.borrow().starts.len(),
            1,
            "no second load of the saved blocks"
        );
        let _ = h3;
        assert!(s.check() && s.kv().check());
    }
}
