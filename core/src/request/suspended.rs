//! The transitions out of the suspended states: (3) resume and (4) recompute and (7) preempt of a
//! [`Suspended<Paused>`], (6) replay of a [`Suspended<Recompute>`], and (8) finish of either (numbers as in
//! the drawing in [`crate::request`]).

use crate::adapter::PeftBackend;
use crate::kv::KvBackend;
use crate::lease::{AdapterDesk, PausedOn};
use crate::{error::Error, storage::Storage};

use super::{Active, KvReturn, Paused, Recompute, Refused, Request, Resumed, State, Suspended};

impl<M> Request<Suspended<M>>
where
    Suspended<M>: State,
{
    /// The paused registration, if the request has an adapter.
    pub fn paused_on(&self) -> Option<&PausedOn> {
        self.state.paused_on.as_ref()
    }

    /// (8) Finish while suspended or waiting to replay: any cache freed, paused registration dropped.
    pub fn finish<K: KvBackend, P: PeftBackend, const T: usize, St: Storage>(
        self,
        kv: &mut K,
        desk: &mut AdapterDesk<P, T, St>,
    ) {
        let r = self.kv_ref();
        if kv.cache(r).exists() {
            kv.free(r);
        }
        let (core, state) = self.into_parts();
        let id = core.id;
        if let Some(p) = state.paused_on {
            desk.drop_paused(id, p);
        }
    }
}

impl Request<Suspended<Paused>> {
    /// (3) Resume: the pass brought the KV back (`how`); the desk mints a fresh lease, consuming the
    /// paused registration. Needs both the KV backend and the adapter desk. Refused when the KV is not
    /// active (nothing changes) or when the lease is refused (the KV is put back exactly as it was).
    pub fn resume<K: KvBackend, P: PeftBackend, const T: usize, St: Storage>(
        self,
        kv: &mut K,
        desk: &mut AdapterDesk<P, T, St>,
        how: KvReturn,
    ) -> Result<Request<Resumed>, Refused<Suspended<Paused>>> {
        if !kv.cache(self.kv_ref()).is_active() {
            return Err(self.not_on_gpu());
        }
        let r = self.kv_ref();
        let (core, state) = self.into_parts();
        let lease = if let Some(t) = core.task() {
            match desk.acquire(kv, core.id, t, state.paused_on) {
                Ok(l) => Some(l),
                Err((paused_on, e)) => {
                    if how == KvReturn::Generation {
                        kv.revert_allocate_generation(r);
                    }
                    kv.suspend(r);
                    let request = Self::build(core, Suspended::new(paused_on));
                    return Err(Refused {
                        request,
                        error: Error::Peft(e),
                    });
                }
            }
        } else {
            assert!(
                state.paused_on.is_none(),
                "no adapter, no paused registration"
            );
            None
        };
        Ok(Self::build(core, Resumed { lease }))
    }

    /// (4) Recompute pause of a suspended request: its KV (held or in the lower tier) is freed; it stays
    /// paused on its adapter for the replay.
    pub fn recompute<K: KvBackend>(self, kv: &mut K) -> Request<Suspended<Recompute>> {
        kv.free(self.kv_ref());
        self.into_recompute()
    }

    /// (7) Preemption of a suspended request whose pages are HELD on the GPU (no lower tier): the pages
    /// are given up; it stays paused on its adapter for the replay. The pass does this only as a deadlock
    /// remedy.
    pub fn preempt<K: KvBackend>(self, kv: &mut K) -> Request<Suspended<Recompute>> {
        kv.preempt(self.kv_ref());
        self.into_recompute()
    }

    fn into_recompute(self) -> Request<Suspended<Recompute>> {
        let (core, state) = self.into_parts();
        Self::build(core, Suspended::new(state.paused_on))
    }
}

impl Request<Suspended<Recompute>> {
    /// (6) Replay: the replay's first chunk got its KV pages; a new lease is acquired, consuming the
    /// paused registration. Refused (nothing changes) when the KV is not active or the lease is refused.
    pub fn replay<K: KvBackend, P: PeftBackend, const T: usize, St: Storage>(
        self,
        kv: &mut K,
        desk: &mut AdapterDesk<P, T, St>,
    ) -> Result<Request<Active>, Refused<Suspended<Recompute>>> {
        if !kv.cache(self.kv_ref()).is_active() {
            return Err(self.not_on_gpu());
        }
        let (core, state) = self.into_parts();
        let lease = match (core.task(), state.paused_on) {
            (Some(t), paused) => match desk.acquire(kv, core.id, t, paused) {
                Ok(l) => Some(l),
                Err((paused_on, e)) => {
                    let request = Self::build(core, Suspended::new(paused_on));
                    return Err(Refused {
                        request,
                        error: Error::Peft(e),
                    });
                }
            },
            (None, paused) => {
                assert!(paused.is_none(), "no adapter, no paused registration");
                None
            }
        };
        Ok(Self::build(core, Active { lease }))
    }
}
