//! The scheduler output: fixed-capacity lists of table slots and the adapter plan.
//!
//! Every list is private and filled only through a `push_*` method that takes the request in the
//! type-state the list stands for: the batch lists (context, generation) accept only [`Schedulable`]
//! requests ([`Active`](crate::request::Active) and [`Resumed`]), `paused` only
//! [`Suspended<Paused>`], `recompute_paused` only [`Suspended<Recompute>`], `resumed` only [`Resumed`].
//! Readers get slices.
//!
//! An entry is a [`Listed`]: the request's table slot, the slot's version (so an entry that outlived
//! its request is recognised) and its adapter task slot, 8 bytes. Everything else about a listed request
//! (its id, its spec) is read from the scheduler on demand (`Scheduler::get(listed.handle())`).
//!
//! Invariant: a list holds at most one entry per live request, so with a table of `N` slots no push can
//! overflow; the pass asserts every push.

use crate::adapter::TaskRef;
use crate::ids::TaskSlot;
use crate::request::{Paused, Recompute, Request, Resumed, Schedulable, State, Suspended};
use crate::scheduler::Handle;
use crate::storage::{FixedList, Inline, Storage};

/// One listed request: its table slot, the slot's version, its adapter task slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Listed {
    slot: u16,
    task: TaskSlot,
    version: u32,
}

impl Listed {
    /// No request (what an unused entry of a scratch array holds).
    pub(crate) const EMPTY: Listed = Listed {
        slot: 0,
        task: TaskSlot(0),
        version: 0,
    };

    #[inline]
    fn of<S: State>(r: &Request<S>) -> Self {
        let place = r.place();
        Self {
            slot: place.slot,
            task: place.task,
            version: place.version,
        }
    }
    /// The request's table slot.
    #[inline]
    pub const fn slot(self) -> u16 {
        self.slot
    }
    /// The request's handle (resolve it with `Scheduler::get`; stale once the request is removed).
    #[inline]
    pub fn handle(self) -> Handle {
        Handle::new(self.slot, self.version)
    }
    /// The adapter task slot, when the request has an adapter in the adapter cache.
    #[inline]
    pub const fn task_slot(self) -> Option<TaskSlot> {
        if self.task.0 == TaskSlot::NONE.0 {
            None
        } else {
            Some(self.task)
        }
    }
    /// The raw task slot ([`TaskSlot::NONE`](crate::ids::TaskSlot::NONE) for none), for the LoRA sort.
    #[inline]
    pub(crate) const fn bucket(self) -> TaskSlot {
        self.task
    }
    /// A test entry at `slot` on task slot `task`.
    #[cfg(test)]
    pub(crate) const fn for_test(slot: u16, task: TaskSlot) -> Self {
        Self {
            slot,
            task,
            version: 0,
        }
    }
    pub(crate) const fn version(self) -> u32 {
        self.version
    }
}

/// One scheduled context chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Chunk {
    /// The request.
    pub listed: Listed,
    /// Prompt tokens this chunk processes.
    pub tokens: u32,
    /// This chunk ends the prompt.
    pub last: bool,
}

impl Chunk {
    /// No chunk (what an unused entry of a scratch array holds).
    pub(crate) const EMPTY: Chunk = Chunk {
        listed: Listed::EMPTY,
        tokens: 0,
        last: false,
    };
}

/// No task (what the unused room of a boxed adapter list holds).
const NO_TASK_REF: TaskRef = TaskRef {
    id: crate::ids::TaskId(0),
    slot: TaskSlot::NONE,
};

/// A fixed-capacity list of `N` entries inside the value ([`Inline`]'s list).
pub type List<T, const N: usize> = heapless::Vec<T, N>;

/// The list was full (cannot happen for a scheduler's own output: see the module invariant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

/// What one pass decided: lists of up to `N` entries, where `S` keeps them (inside the value,
/// [`Inline`], the default; or each in a heap allocation of its own, `Boxed`).
#[derive(Debug, Clone)]
pub struct SchedulerOutput<const N: usize, S: Storage = Inline> {
    context: S::List<Chunk, N>,
    generation: S::List<Listed, N>,
    encoder: S::List<Listed, N>,
    paused: S::List<Listed, N>,
    recompute_paused: S::List<Listed, N>,
    disagg: S::List<Listed, N>,
    resumed: S::List<Listed, N>,
    adapters: S::List<TaskRef, N>,
    adapter_loads: S::List<TaskRef, N>,
    has_chunking: bool,
    /// The pass that filled it (0: none), so a step is completed once, with its own pass's output.
    pass: u64,
}

/// The lists the LoRA sort orders, in place: generation, context, encoder, and the adapter plan.
pub(crate) type Sortable<'a, const N: usize, S> = (
    &'a mut <S as Storage>::List<Listed, N>,
    &'a mut <S as Storage>::List<Chunk, N>,
    &'a mut <S as Storage>::List<Listed, N>,
    &'a mut <S as Storage>::List<TaskRef, N>,
);

fn push<T>(list: &mut impl FixedList<T>, item: T) -> Result<(), Full> {
    list.push(item).map_err(|_| Full)
}

impl<const N: usize> Default for SchedulerOutput<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> SchedulerOutput<N> {
    /// An empty output inside the value (const: a `static` can hold it).
    pub const fn new() -> Self {
        Self {
            context: heapless::Vec::new(),
            generation: heapless::Vec::new(),
            encoder: heapless::Vec::new(),
            paused: heapless::Vec::new(),
            recompute_paused: heapless::Vec::new(),
            disagg: heapless::Vec::new(),
            resumed: heapless::Vec::new(),
            adapters: heapless::Vec::new(),
            adapter_loads: heapless::Vec::new(),
            has_chunking: false,
            pass: 0,
        }
    }
}

impl<const N: usize, St: Storage> SchedulerOutput<N, St> {
    /// An empty output in storage `S` (with `Boxed`: every list its own heap allocation, the value a
    /// few hundred bytes). Refused only when `S` cannot have the memory.
    pub fn new_in() -> Result<Self, crate::Error> {
        Ok(Self {
            context: St::list(Chunk::EMPTY)?,
            generation: St::list(Listed::EMPTY)?,
            encoder: St::list(Listed::EMPTY)?,
            paused: St::list(Listed::EMPTY)?,
            recompute_paused: St::list(Listed::EMPTY)?,
            disagg: St::list(Listed::EMPTY)?,
            resumed: St::list(Listed::EMPTY)?,
            adapters: St::list(NO_TASK_REF)?,
            adapter_loads: St::list(NO_TASK_REF)?,
            has_chunking: false,
            pass: 0,
        })
    }

    /// Empties every list (the pass does this first).
    pub(crate) fn clear(&mut self) {
        self.context.clear();
        self.generation.clear();
        self.encoder.clear();
        self.paused.clear();
        self.recompute_paused.clear();
        self.disagg.clear();
        self.resumed.clear();
        self.adapters.clear();
        self.adapter_loads.clear();
        self.has_chunking = false;
        self.pass = 0;
    }

    /// The pass that filled this output (0 before any).
    pub fn pass(&self) -> u64 {
        self.pass
    }

    pub(crate) fn set_pass(&mut self, pass: u64) {
        self.pass = pass;
    }

    /// The last pass's lists stand for pass `pass` too (an incremental pass): only the adapter loads,
    /// which `ensure_batch` fills after a pass, start empty.
    pub(crate) fn replayed(&mut self, pass: u64) {
        self.adapter_loads.clear();
        self.pass = pass;
    }

    /// Context chunks to run (non-final chunks first when any, each part sorted by LoRA key).
    pub fn context(&self) -> &[Chunk] {
        &self.context
    }
    /// Decode steps to run (sorted by LoRA key).
    pub fn generation(&self) -> &[Listed] {
        &self.generation
    }
    /// Encoder requests to run.
    pub fn encoder(&self) -> &[Listed] {
        &self.encoder
    }
    /// Ordinarily suspended requests (victims and self-evictions).
    pub fn paused(&self) -> &[Listed] {
        &self.paused
    }
    /// Destructively freed requests (recompute pause and preemption victims): reset them for replay.
    pub fn recompute_paused(&self) -> &[Listed] {
        &self.recompute_paused
    }
    /// Disaggregated generation requests whose transfer may start.
    pub fn disagg(&self) -> &[Listed] {
        &self.disagg
    }
    /// Requests whose KV came back this pass: their lower-tier pages must be copied up (the move log)
    /// before the step runs.
    pub fn resumed(&self) -> &[Listed] {
        &self.resumed
    }
    /// Distinct adapters the scheduled batch needs on the device (the adapter plan), by task id.
    pub fn adapters(&self) -> &[TaskRef] {
        &self.adapters
    }
    /// Adapters that had to be copied to the device (filled by `ensure_batch`).
    pub fn adapter_loads(&self) -> &[TaskRef] {
        &self.adapter_loads
    }
    /// A scheduled context chunk is not the last one.
    pub fn has_chunking(&self) -> bool {
        self.has_chunking
    }
    /// Encoders + contexts + generations (disagg excluded).
    pub fn num_fitting(&self) -> usize {
        self.encoder.len() + self.context.len() + self.generation.len()
    }

    /// Adds a decode step of a schedulable request.
    #[inline]
    pub fn push_generation<S: Schedulable>(&mut self, request: &Request<S>) -> Result<(), Full> {
        push(&mut self.generation, Listed::of(request))
    }

    /// Adds a context chunk of a schedulable request.
    pub fn push_context<S: Schedulable>(
        &mut self,
        request: &Request<S>,
        tokens: u32,
        last: bool,
    ) -> Result<(), Full> {
        self.has_chunking |= !last;
        let chunk = Chunk {
            listed: Listed::of(request),
            tokens,
            last,
        };
        push(&mut self.context, chunk)
    }

    /// Adds an encoder request (it runs the encoder only: it owns no decoder KV).
    pub fn push_encoder<S: State>(&mut self, request: &Request<S>) -> Result<(), Full> {
        push(&mut self.encoder, Listed::of(request))
    }

    /// Adds an ordinarily suspended request.
    pub fn push_paused(&mut self, request: &Request<Suspended<Paused>>) -> Result<(), Full> {
        push(&mut self.paused, Listed::of(request))
    }

    /// Adds a destructively freed request.
    pub fn push_recompute(&mut self, request: &Request<Suspended<Recompute>>) -> Result<(), Full> {
        push(&mut self.recompute_paused, Listed::of(request))
    }

    /// Adds a disaggregated generation request that took ownership of its prepared KV.
    pub fn push_disagg<S: Schedulable>(&mut self, request: &Request<S>) -> Result<(), Full> {
        push(&mut self.disagg, Listed::of(request))
    }

    /// Adds a request whose KV came back.
    pub fn push_resumed(&mut self, request: &Request<Resumed>) -> Result<(), Full> {
        push(&mut self.resumed, Listed::of(request))
    }

    /// Takes a request off the paused list (it became a recompute or preemption victim in the same
    /// pass: it is listed once, in `recompute_paused`). Returns whether it was there.
    pub(crate) fn unlist_paused(&mut self, slot: u16) -> bool {
        match self.paused.iter().position(|l| l.slot == slot) {
            Some(i) => {
                self.paused.remove(i);
                true
            }
            None => false,
        }
    }

    /// A task enters the adapter plan.
    pub(crate) fn push_adapter(&mut self, task: TaskRef) -> Result<(), Full> {
        push(&mut self.adapters, task)
    }

    /// The lists the LoRA sort orders, with the plan.
    pub(crate) fn sortable(&mut self) -> Sortable<'_, N, St> {
        (
            &mut self.generation,
            &mut self.context,
            &mut self.encoder,
            &mut self.adapters,
        )
    }

    /// The plan and the loads list, for `ensure_batch`.
    pub(crate) fn plan_and_loads(&mut self) -> (&[TaskRef], &mut St::List<TaskRef, N>) {
        (&self.adapters, &mut self.adapter_loads)
    }

    /// The request lists after the context list, in wire order: generation, encoder, paused,
    /// recompute-paused, disagg, resumed.
    pub(crate) fn request_lists(&self) -> [&[Listed]; 6] {
        [
            &self.generation,
            &self.encoder,
            &self.paused,
            &self.recompute_paused,
            &self.disagg,
            &self.resumed,
        ]
    }
}
