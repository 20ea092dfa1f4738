//! A small scheduler harness for the scenario tests of `priority.rs` and `classes.rs`: a pool, an
//! adapter cache with tasks 1 and 2, and one pass with its step at a time, by request id.

use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::ids::TaskId;
use kvsched_core::output::SchedulerOutput;
use kvsched_core::page_pool::{KvPool, KvPoolConfig};
use kvsched_core::request::{Ownership, RequestSpec};
use kvsched_core::scheduler::{Handle, Scheduler};
use kvsched_core::storage::Owned;
use kvsched_core::{Config, Phase};

pub type Sched = Scheduler<KvPool<'static, Owned>, AdapterPool<8>, 16, 8>;
pub type Out = SchedulerOutput<16>;

const TPB: u32 = 16;

/// What one pass did, by request id.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Did {
    pub context: Vec<u64>,
    pub generation: Vec<u64>,
    pub paused: Vec<u64>,
    pub recompute: Vec<u64>,
    pub yielded: u32,
}

pub struct Run {
    pub s: Sched,
    pub out: Out,
}

impl Run {
    /// A scheduler of `gpu` GPU and `host` host pages, an adapter cache of `adapter_pages` device
    /// pages (tasks 1 and 2 take one page each), recompute pause allowed and `edit` applied.
    pub fn with(gpu: u32, host: u32, adapter_pages: u32, edit: impl FnOnce(&mut Config)) -> Self {
        let pool = KvPool::owned(KvPoolConfig {
            tokens_per_block: TPB,
            gpu_pages: gpu,
            host_pages: host,
            slots: 16,
            max_blocks: 16,
        })
        .unwrap();
        let mut adapters = AdapterPool::new(adapter_pages, 16).unwrap();
        adapters.register(TaskId(1), 1).unwrap();
        adapters.register(TaskId(2), 1).unwrap();
        let mut cfg = Config {
            recompute_pause: true,
            ..Config::default()
        };
        edit(&mut cfg);
        Self {
            s: Scheduler::new(cfg, pool, adapters).unwrap(),
            out: Out::new(),
        }
    }

    /// Submits a request of `prompt` tokens and 16 output tokens, of `priority`, in service class
    /// `class`, on adapter `lora`.
    pub fn submit_in(
        &mut self,
        id: u64,
        prompt: u32,
        (priority, class): (u8, u8),
        lora: Option<u64>,
    ) -> Handle {
        let mut spec = RequestSpec::new(id, Phase::ContextInit, prompt);
        spec.priority = priority;
        spec.class = class;
        spec.lora = lora.map(TaskId);
        spec.max_new_tokens = 16;
        self.s.submit(spec).unwrap()
    }

    /// Submits a request of `prompt` tokens and 16 output tokens, of `priority`, on adapter `lora`.
    pub fn submit(&mut self, id: u64, prompt: u32, priority: u8, lora: Option<u64>) -> Handle {
        self.submit_in(id, prompt, (priority, 0), lora)
    }

    fn id(&self, l: &kvsched_core::output::Listed) -> u64 {
        self.s.get(l.handle()).unwrap().spec().id.0
    }

    /// One pass and its step, the scheduler checked.
    pub fn step(&mut self) -> Did {
        self.s.schedule(&mut self.out).unwrap();
        let o = &self.out;
        let did = Did {
            context: o.context().iter().map(|c| self.id(&c.listed)).collect(),
            generation: o.generation().iter().map(|l| self.id(l)).collect(),
            paused: o.paused().iter().map(|l| self.id(l)).collect(),
            recompute: o.recompute_paused().iter().map(|l| self.id(l)).collect(),
            yielded: self.s.last_pass().yielded,
        };
        self.s.ensure_batch(&mut self.out).unwrap();
        let _ = self.s.take_moves();
        self.s.complete_step(&self.out).unwrap();
        assert!(self.s.check());
        did
    }

    /// What the request of `h` owns.
    pub fn ownership(&self, h: Handle) -> Ownership {
        self.s.get(h).unwrap().ownership()
    }
}
