//! Disaggregated serving: a prefill engine computes a prompt's KV and its first token, and sends
//! the KV's pages to a decode engine, which writes them into its own store and decodes the rest,
//! both through the core's transfer-manager arrows.
//!
//! - Prefill side: [`Engine::submit_context_only`] (a context-only request, scheduled as
//!   `CONTEXT_INIT` chunks); the `complete_step` of its last chunk makes it sending
//!   (`DISAGG_CONTEXT_TRANS_IN_PROGRESS`, its pages pinned) and the step samples its first token;
//!   [`Engine::sends`] lists it, [`Engine::export_kv`] copies its prompt's pages out of the store,
//!   [`Engine::end_send`] ends the send (the request is removed, its pages freed).
//! - Decode side: [`Engine::submit_transferred`] (`DISAGG_GENERATION_INIT`): a pass prepares the
//!   prompt's pages and lists the request in `disagg`; the step then starts the receive, writes the
//!   transferred pages into the pages its table names and ends the receive
//!   (`DISAGG_GENERATION_TRANS_COMPLETE`, position = prompt); the next pass decodes it.
//!
//! Full attention only: an engine on KV groups refuses both ([`Grouped::Disaggregated`]), since a
//! transfer is one table's pages of every layer.

use kvsched_core::request::{Ownership, RequestSpec};
use kvsched_core::scheduler::TransferEnd;
use kvsched_core::{Phase, TaskId};
use kvsched_gpu::{PageStore, Tier};

use super::{block_hashes, gpu_pages, Engine, Live};
use crate::error::{EngineError, Grouped, Refusal, Result};
use crate::sample::Sampler;

/// A prompt's KV on its way from a prefill engine to a decode engine ([`Engine::export_kv`]).
#[derive(Debug, Clone, PartialEq)]
pub struct KvTransfer {
    /// The prompt.
    pub prompt: Vec<u32>,
    /// The first token, sampled by the prefill engine.
    pub first: u32,
    /// The logits it was drawn from (with [`crate::EngineConfig::keep_logits`]; else empty).
    pub logits: Vec<Vec<f32>>,
    /// The sampler after drawing it (the decode engine continues its draws).
    pub sampler: Sampler,
    /// The request's adapter.
    pub adapter: Option<u64>,
    /// Positions a page holds.
    pub tokens_per_block: u32,
    /// The bytes of the prompt's pages, in table order (every layer of each page).
    pub pages: Vec<Vec<u8>>,
}

impl Engine<'_> {
    /// Queues a context-only request of disaggregated serving: its prompt is prefilled here and its
    /// first token sampled; then it waits in [`Engine::sends`] for its KV to be sent. Refused as
    /// [`Engine::submit`], and on KV groups ([`EngineError::Grouped`]).
    pub fn submit_context_only(
        &mut self,
        prompt: &[u32],
        adapter: Option<u64>,
        sampler: Sampler,
    ) -> Result<u64> {
        self.full_only()?;
        self.check_request(prompt, 1, adapter)?;
        let mut spec = RequestSpec::context_only(self.next_id, prompt.len() as u32);
        spec.max_new_tokens = 1;
        spec.lora = adapter.map(TaskId);
        self.enqueue(spec, prompt.to_vec(), (1, adapter, sampler), None)
    }

    /// Context-only requests whose KV is ready to send (their first token sampled), by id.
    pub fn sends(&self) -> Vec<u64> {
        self.live
            .iter()
            .flatten()
            .filter(|l| l.context_only && l.tokens.len() > l.prompt)
            .map(|l| l.id)
            .collect()
    }

    /// The KV of sending request `id`: its prompt's pages copied out of the store, its first token
    /// and sampler. Refused (`Batch`) for an id that is not sending.
    pub fn export_kv(&self, id: u64) -> Result<KvTransfer> {
        let live = self.sending(id)?;
        let slot = live.handle.index();
        let table = gpu_pages(self.sched.leader().table(slot), slot)?;
        let store = &self.kv[0].kv;
        let bytes = store.shape().page_bytes;
        let used = (live.prompt).div_ceil(self.cfg.tokens_per_block as usize);
        let mut pages = Vec::with_capacity(used);
        for &p in table.iter().take(used) {
            let mut page = vec![0; bytes];
            store.read_page(Tier::Gpu, p, &mut page)?;
            pages.push(page);
        }
        Ok(KvTransfer {
            prompt: live.tokens[..live.prompt].to_vec(),
            first: live.tokens[live.prompt],
            logits: live.logits.clone(),
            sampler: live.sampler.clone(),
            adapter: live.adapter,
            tokens_per_block: self.cfg.tokens_per_block,
            pages,
        })
    }

    /// Ends the send of request `id` (`delivered` or not: either way nothing reads its pages any
    /// more): arrow (10), the request is removed and its pages freed. Refused (`Batch`) for an id
    /// that is not sending.
    pub fn end_send(&mut self, id: u64, delivered: bool) -> Result<()> {
        let slot = self.sending(id)?.handle.index();
        let how = if delivered {
            TransferEnd::Delivered
        } else {
            TransferEnd::Failed
        };
        if let Some(live) = self.live[usize::from(slot)].take() {
            self.sched.end_send(live.handle, how)?;
            self.stats.finished += 1;
            self.stats.kv_sent += 1;
        }
        Ok(())
    }

    fn sending(&self, id: u64) -> Result<&Live> {
        self.live
            .iter()
            .flatten()
            .find(|l| l.id == id && l.context_only && l.tokens.len() > l.prompt)
            .filter(|l| {
                self.sched
                    .get(l.handle)
                    .is_ok_and(|e| e.ownership() == Ownership::Sending)
            })
            .ok_or_else(|| EngineError::Batch(format!("request {id} is not sending its KV")))
    }

    /// Queues a request whose prompt's KV was computed by a prefill engine: its pages are written
    /// into this engine's store when a pass prepares them, then it decodes up to `max_new_tokens`
    /// tokens in all (the transferred first token counts). Refused as [`Engine::submit`],
    /// (`Refused`/`Config`) for a transfer of another page size or page count than this engine's,
    /// and on KV groups ([`EngineError::Grouped`]).
    pub fn submit_transferred(&mut self, kv: KvTransfer, max_new_tokens: usize) -> Result<u64> {
        self.full_only()?;
        self.check_request(&kv.prompt, max_new_tokens, kv.adapter)?;
        let bytes = self.kv[0].kv.shape().page_bytes;
        let tpb = self.cfg.tokens_per_block;
        let want = kv.prompt.len().div_ceil(tpb as usize);
        if kv.tokens_per_block != tpb
            || kv.pages.len() != want
            || kv.pages.iter().any(|p| p.len() != bytes)
        {
            return Err(EngineError::Config(format!(
                "a transfer of {} pages of {} positions does not fit pages of {tpb} positions and \
                 {bytes} bytes ({want} for the prompt)",
                kv.pages.len(),
                kv.tokens_per_block
            )));
        }
        if kv.first as usize >= self.model.config().vocab {
            let vocab = self.model.config().vocab;
            return Err(Refusal::Token {
                token: kv.first,
                vocab,
            }
            .into());
        }
        let mut spec = RequestSpec::new(
            self.next_id,
            Phase::DisaggGenerationInit,
            kv.prompt.len() as u32,
        );
        spec.max_new_tokens = max_new_tokens as u32;
        spec.lora = kv.adapter.map(TaskId);
        let mut tokens = kv.prompt;
        tokens.push(kv.first);
        let prompt = tokens.len() - 1;
        let id = self.enqueue(
            spec,
            tokens,
            (max_new_tokens, kv.adapter, kv.sampler),
            Some(kv.pages),
        )?;
        if let Some(live) = self.live.iter_mut().flatten().find(|l| l.id == id) {
            live.prompt = prompt;
            live.logits = kv.logits;
        }
        Ok(id)
    }

    /// The receives the pass allows: each listed request's transferred pages written into the GPU
    /// pages its table names (start_receive, the copy, end_receive).
    pub(super) fn receive_transfers(&mut self) -> Result<()> {
        for i in 0..self.out.disagg().len() {
            let l = self.out.disagg()[i];
            let Some(live) = self.live[usize::from(l.slot())]
                .as_mut()
                .filter(|r| r.handle == l.handle())
            else {
                continue;
            };
            let Some(pages) = live.incoming.take() else {
                continue;
            };
            self.sched.start_receive(l.handle())?;
            let table = gpu_pages(self.sched.leader().table(l.slot()), l.slot())?;
            if table.len() < pages.len() {
                return Err(EngineError::Batch(format!(
                    "request {}: {} pages prepared for {} transferred",
                    live.id,
                    table.len(),
                    pages.len()
                )));
            }
            let group = &mut self.kv[0];
            for (&p, bytes) in table.iter().zip(&pages) {
                group.kv.write_page(Tier::Gpu, p, bytes)?;
                group.dirty.gpu[p as usize] = true;
            }
            self.sched.end_receive(l.handle(), TransferEnd::Delivered)?;
            live.computed = live.prompt;
            self.stats.kv_received += 1;
        }
        Ok(())
    }

    /// Refused on KV groups: disaggregated serving is full attention only.
    fn full_only(&self) -> Result<()> {
        if self.sched.grouped() {
            return Err(EngineError::Grouped(Grouped::Disaggregated));
        }
        Ok(())
    }

    /// Submits `spec` with `tokens` (the prompt, then any generated) and records the request.
    pub(super) fn enqueue(
        &mut self,
        spec: RequestSpec,
        tokens: Vec<u32>,
        how: (usize, Option<u64>, Sampler),
        incoming: Option<Vec<Vec<u8>>>,
    ) -> Result<u64> {
        let id = self.enqueue_salted(spec, tokens, how, 0)?;
        if let Some(live) = self.live.iter_mut().flatten().find(|l| l.id == id) {
            live.incoming = incoming;
        }
        Ok(id)
    }

    /// [`Self::enqueue`] with a cache salt (the prefix cache's root) and nothing incoming.
    pub(super) fn enqueue_salted(
        &mut self,
        spec: RequestSpec,
        tokens: Vec<u32>,
        how: (usize, Option<u64>, Sampler),
        salt: u64,
    ) -> Result<u64> {
        let id = self.enqueue_as(self.next_id, spec, tokens, how, salt)?;
        self.next_id += 1;
        Ok(id)
    }

    /// [`Self::enqueue_salted`] under an id already given out (a sample's, `samples.rs`): `spec`'s.
    pub(super) fn enqueue_as(
        &mut self,
        id: u64,
        mut spec: RequestSpec,
        tokens: Vec<u32>,
        how: (usize, Option<u64>, Sampler),
        salt: u64,
    ) -> Result<u64> {
        spec.id = kvsched_core::ids::RequestId(id);
        let prompt = spec.prompt as usize;
        let context_only = spec.context_only;
        let hashes = block_hashes(&tokens[..prompt], self.cfg.tokens_per_block as usize);
        let handle = self
            .sched
            .submit_with_prefix(spec, salt, &hashes)
            .map_err(Refusal::Scheduler)?;
        let keys = self.keys_of(handle.index(), &hashes);
        let mut live = Live::new(handle, id, tokens, how);
        (live.prompt, live.context_only, live.keys) = (prompt, context_only, keys);
        self.live[usize::from(handle.index())] = Some(live);
        Ok(id)
    }
}
