//! The steps of a scenario's run: its initial requests, and each pass with what the engine does
//! before it, checked against its expectations or recorded ([`crate::record`]).

use kvsched_core::kv::KvBackend;

use crate::error::{Reason, ScenarioError};
use crate::scenario::{PassIn, Scenario};
use crate::{expected_error, hybrid, Out, Pass, Run};

impl<K: KvBackend> Run<K> {
    /// The scenario's initial requests and adapter leases; `Some(line)` when a refusal the scenario
    /// expects (the first pass's `expect.error`) is its outcome.
    pub(crate) fn add_initial(&mut self, sc: &Scenario) -> Result<Option<String>, ScenarioError> {
        for (i, r) in sc.requests.iter().enumerate() {
            if let Err(refusal) = self.add(&format!("requests[{i}]"), r) {
                return match expected_error(sc) {
                    Some(want) if refusal.expected(want) => Ok(Some(format!("refused {i}"))),
                    _ => Err(refusal.malformed()),
                };
            }
        }
        if sc.peft.is_some() {
            self.leases_fit("peft.max_device_pages")?;
            self.peft.load_leased();
        }
        Ok(None)
    }

    /// Pass `k` of `passes`: what the engine does before it, the pass, and its trace line (checked
    /// against its expectations, or with `record` the ensure-batch outcome added instead).
    pub(crate) fn pass(
        &mut self,
        sc: &Scenario,
        out: &mut Out,
        (k, passes): (usize, &[PassIn]),
        record: bool,
    ) -> Result<String, ScenarioError> {
        let pass = &passes[k];
        if k > 0 {
            self.between_passes(out, k, pass)?;
        }
        let inflight = if k == 0 && pass.inflight.is_empty() {
            &sc.inflight
        } else {
            &pass.inflight
        };
        self.prepare_pass(pass, inflight)?;
        let result = self.sched.schedule(out);
        // The state group's logs drained, as an engine must every step.
        let seen = self.state.as_ref().map(|observe| observe(&mut self.sched));
        if record {
            // As the check does: the batch's adapters made resident on a copy of the output.
            let ensured = (self.has_peft && result.is_ok()).then(|| {
                let mut o = out.clone();
                self.sched.ensure_batch(&mut o).map_err(|e| e.to_string())
            });
            let line = self.record_line(out, &result, ensured.as_ref());
            return Ok(line + &hybrid::trace(seen.as_ref()));
        }
        let line = self.trace(out, &result) + &hybrid::trace(seen.as_ref());
        let at = Pass::new(k, passes.len());
        let state = hybrid::check(pass.expect.state.as_ref(), seen.as_ref(), &at.expect)?;
        hybrid::merge(self.check(out, result, &pass.expect, &at), state, at.number)?;
        Ok(line)
    }

    /// The started requests' leases fit the scripted adapter cache's device pages (which, unlike a
    /// real adapter cache, takes any lease; an adopted request's lease over its pages would break the
    /// pass's invariant that pinned adapters fit).
    pub(crate) fn leases_fit(&self, field: &str) -> Result<(), ScenarioError> {
        use kvsched_core::adapter::PeftBackend;
        let pinned = self.sched.adapters().pinned_pages();
        let pages = self.peft.max_device_pages();
        if self.has_peft && pinned > pages {
            return Err(ScenarioError::malformed(
                field,
                Reason::LeasesOverCache { pinned, pages },
            ));
        }
        Ok(())
    }
}
