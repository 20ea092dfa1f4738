//! The transfer manager: the disaggregated states' lifecycle (spec §1.4 step 3, §1.12, §1.15).
//!
//! In disaggregated serving a context engine computes a prompt's KV and sends it to a generation
//! engine, which decodes. The bytes move through the engine's transceiver (NIXL, UCX, NCCL, a CUDA
//! IPC copy); this module owns what the scheduler must get right around them: which pages a transfer
//! reads or writes, that nothing evicts, frees or reuses them meanwhile, and what each end of a transfer
//! does to the request.
//!
//! ```text
//!  context engine                              generation engine
//!  submit context_only, phase 10 CONTEXT_INIT     submit, phase 8 DISAGG_GENERATION_INIT
//!     │ scheduled as context chunks                   │ a pass prepares the whole prompt's pages
//!     ▼ complete_step of the last chunk               ▼ (listed in `disagg`); start_receive:
//!  phase 21 DISAGG_CONTEXT_TRANS_IN_PROGRESS      phase 9 DISAGG_GENERATION_TRANS_IN_PROGRESS
//!  Request<Sending>: pages pinned, lease returned  Request<Active>: pages written by the receive
//!     │ end_send (delivered or not)                   │ end_receive(Delivered) │ end_receive(Failed)
//!     ▼                                               ▼                        ▼
//!  removed, pages freed                           phase 12 → 13: decodes   (4) recompute: KV freed,
//!  (its committed blocks stay cached)             (its blocks committed)   replays its prefill here
//! ```
//!
//! While a transfer is in flight its request is in a transfer-holding phase: not started, so never an
//! eviction, recompute or preemption victim, and a pass that schedules nothing beside it is not a stall
//! (its pages will come free). A transfer that never ends is the engine's to bound: it cancels the
//! transfer in its transceiver first (so nothing reads or writes the pages any more) and then reports
//! the end — the core never frees pages a transfer may still touch.

use crate::adapter::PeftBackend;
use crate::error::Error;
use crate::kv::{KvBackend, KvCaps, KvRef, PrefixReuse};
use crate::phase::Phase;
use crate::request::{Ownership, RequestSpec};
use crate::storage::Storage;

use super::table::AnyRequest;
use super::{Handle, Scheduler};

/// How a transfer ended, as the engine's transceiver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransferEnd {
    /// Every page arrived.
    Delivered,
    /// It failed, or the engine cancelled it (a timeout): nothing reads or writes the pages any more.
    Failed,
}

/// The transfers of one engine: in flight now, and ended so far by outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TransferStats {
    /// Context side: requests whose KV is being sent ([`Ownership::Sending`]).
    pub sending: u32,
    /// Generation side: requests whose pages a receive is writing (`DISAGG_GENERATION_TRANS_IN_PROGRESS`).
    pub receiving: u32,
    /// Sends ended [`TransferEnd::Delivered`].
    pub sent: u64,
    /// Sends ended [`TransferEnd::Failed`].
    pub sends_failed: u64,
    /// Receives ended [`TransferEnd::Delivered`].
    pub received: u64,
    /// Receives ended [`TransferEnd::Failed`] (each request replays its prefill here).
    pub receives_failed: u64,
}

impl TransferStats {
    /// No transfer (a scheduler before its first).
    pub(crate) const NONE: TransferStats = TransferStats {
        sending: 0,
        receiving: 0,
        sent: 0,
        sends_failed: 0,
        received: 0,
        receives_failed: 0,
    };
}

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Scheduler<K, P, N, T, S>
{
    /// complete_step, context side: a context-only request ([`RequestSpec::context_only`]) whose prompt
    /// is computed takes arrow (9):
    /// its lease goes back, its pages stay pinned for the send.
    pub(super) fn start_send(&mut self, slot: u16) {
        let (kv, desk) = (&mut self.kv, &mut self.desk);
        self.table.transition(slot, |held| match held {
            AnyRequest::Active(a) => (a.send(kv, desk).into(), ()),
            AnyRequest::Resumed(a) => (a.send(kv, desk).into(), ()),
            _ => panic!("a computed context chunk's request owns its KV and its lease"),
        });
        self.table.edit(slot, |e| {
            e.spec_mut().phase = Phase::DisaggContextTransInProgress;
        });
    }

    /// Context side: the send of a request's KV ended (`how` is for the engine's records; either way
    /// nothing reads the pages any more). Arrow (10): the request is removed and its pages freed; its
    /// committed blocks stay in the prefix cache. Refused ([`Error::Invalid`], nothing changes) for a
    /// request that is not sending; [`Error::StaleHandle`] for a handle that names no live request.
    pub fn end_send(&mut self, h: Handle, how: TransferEnd) -> Result<RequestSpec, Error> {
        self.changed();
        let e = self.table.get(h).ok_or(Error::StaleHandle)?;
        if e.ownership() != Ownership::Sending {
            return Err(Error::Invalid(
                "end_send: the request is not sending its KV",
            ));
        }
        let ends = &mut self.transfer_ends;
        match how {
            TransferEnd::Delivered => ends.sent += 1,
            TransferEnd::Failed => ends.sends_failed += 1,
        }
        self.discard(h)
    }

    /// Generation side: the transceiver starts writing the prompt's KV into a request's pages, which a
    /// pass prepared (it listed the request in `disagg`): `DISAGG_GENERATION_TRANS_IN_PROGRESS`. Until
    /// then the request stays `DISAGG_GENERATION_INIT` and each pass prepares and lists it again, as the
    /// reference does. Refused ([`Error::Invalid`], nothing changes) unless the request is
    /// `DISAGG_GENERATION_INIT` with its KV on the GPU; [`Error::StaleHandle`] for a handle that names
    /// no live request.
    pub fn start_receive(&mut self, h: Handle) -> Result<(), Error> {
        self.changed();
        let e = self.table.get(h).ok_or(Error::StaleHandle)?;
        if !(e.spec().phase == Phase::DisaggGenerationInit && e.ownership().on_gpu()) {
            return Err(Error::Invalid(
                "start_receive: the request's pages are not prepared (a pass lists it in disagg)",
            ));
        }
        self.table.edit(h.index(), |e| {
            e.spec_mut().phase = Phase::DisaggGenerationTransInProgress;
        });
        Ok(())
    }

    /// Generation side: the receive into a prepared request's pages ended.
    /// - [`TransferEnd::Delivered`]: the prompt is in place (`DISAGG_GENERATION_TRANS_COMPLETE`, position
    ///   = prompt, its blocks join the prefix cache); the next pass schedules it as a generation.
    /// - [`TransferEnd::Failed`]: arrow (4), recompute: its KV is freed, its lease paused, and it replays
    ///   its prefill on this engine as a first-chunk `CONTEXT_INIT` (vLLM's `recompute` load-failure
    ///   policy; remove it instead to fail the request).
    ///
    /// Refused ([`Error::Invalid`], nothing changes) unless the request is receiving
    /// (`DISAGG_GENERATION_TRANS_IN_PROGRESS` with its KV on the GPU); [`Error::StaleHandle`] for a
    /// handle that names no live request.
    pub fn end_receive(&mut self, h: Handle, how: TransferEnd) -> Result<(), Error> {
        self.changed();
        let e = self.table.get(h).ok_or(Error::StaleHandle)?;
        let receiving = e.spec().phase == Phase::DisaggGenerationTransInProgress;
        if !(receiving && e.ownership().on_gpu()) {
            return Err(Error::Invalid(
                "end_receive: the request is not receiving its KV",
            ));
        }
        let slot = h.index();
        let r = KvRef {
            slot,
            id: e.spec().id,
        };
        match how {
            TransferEnd::Delivered => {
                let prompt = self.table.edit(slot, |e| {
                    let s = e.spec_mut();
                    s.phase = Phase::DisaggGenerationTransComplete;
                    s.position = s.prompt;
                    s.prompt
                });
                if let Some(p) = self.kv.prefix() {
                    p.commit(r, prompt);
                }
                self.transfer_ends.received += 1;
            }
            TransferEnd::Failed => {
                let (kv, desk) = (&mut self.kv, &mut self.desk);
                self.table.transition(slot, |held| match held {
                    AnyRequest::Active(a) => (a.recompute(kv, desk).into(), ()),
                    AnyRequest::Resumed(a) => (a.recompute(kv, desk).into(), ()),
                    _ => panic!("a receiving request owns its KV and its lease"),
                });
                self.table.edit(slot, |e| {
                    let s = e.spec_mut();
                    s.phase = Phase::ContextInit;
                    s.position = 0;
                });
                self.transfer_ends.receives_failed += 1;
            }
        }
        Ok(())
    }

    /// This engine's transfers: those in flight (a scan of the table) and those ended.
    pub fn transfer_stats(&self) -> TransferStats {
        let mut t = self.transfer_ends;
        for (_, e) in self.requests() {
            if e.ownership() == Ownership::Sending {
                t.sending += 1;
            } else if e.spec().phase == Phase::DisaggGenerationTransInProgress
                && e.ownership().on_gpu()
            {
                t.receiving += 1;
            }
        }
        t
    }
}
