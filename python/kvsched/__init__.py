"""kvsched: the scheduler core for LLM serving, from Python.

``Scheduler`` is the native scheduler (its KV pool and adapter cache inside): ``submit``, ``schedule``,
``ensure_batch``, ``take_moves``, ``complete_step``, ``finish``. Errors are ``KvschedError`` and its
subclasses (``DuplicateRequest`` for an id already live, ``UnknownRequest`` for one that is not), with
the core's messages; a refused call changes nothing. ``__version__`` is the package's version.

``ReferenceShapedScheduler`` wraps it with the shape of TensorRT-LLM's scheduler result, so a
PyExecutor-style loop can swap it in: ``schedule_request(active_requests, inflight_request_ids)``
returns a ``SchedulerOutput`` whose lists hold the engine's own request objects.

KV events for a KV-aware router (NVIDIA Dynamo's, llm-d's): ``Scheduler(kv_events=N)`` logs them,
``take_kv_events`` drains them, ``prefix_root`` and ``chain`` give the keys a prompt's blocks carry, and
``encode_kv_events`` writes vLLM 0.33's batch (byte-identical to msgspec's) for a ZMQ PUB socket.

Without one object per request: ``schedule_buffers`` returns each list as one ``bytes`` object of packed
entries (``ENTRY_FORMAT``; ``ids(buf)`` reads the ids, ``numpy.frombuffer(buf, ENTRY_DTYPE)`` the
rest), the same objects again after an incremental pass (the last pass's steady decode batch kept);
``take_delta`` says what entered, left and changed in the batch since the last call, for an engine that
keeps a persistent batch.

Hybrid recurrent models (Mamba-2, gated DeltaNet): ``Scheduler(state_gpu_slots=..., state_host_slots=...,
state_snapshot_slots=..., state_snapshot_interval=..., state_slot_bytes=...)`` adds a recurrent-state
group; each scheduled ``Entry`` names its live GPU ``state_slot``, ``take_state_moves`` gives the state
copies to run before the step (``StateMove``: "to_host", "to_gpu", "restore") and ``take_captures`` the
snapshots to write during it (``Capture``).
"""

# The module's own names only: the imports it needs are underscored, so ``dir(kvsched)`` and
# ``from kvsched import *`` show what ``__all__`` lists (and the dunders).
from dataclasses import asdict as _asdict, dataclass as _dataclass, field as _field
from typing import Any as _Any, Dict as _Dict, Iterable as _Iterable, List as _List
from typing import Optional as _Optional

from ._native import (  # noqa: F401  (re-exported)
    AdapterError,
    Buffers,
    CapacityError,
    Capture,
    DeadlockError,
    Delta,
    DuplicateRequest,
    Entry,
    KvEvent,
    KvschedError,
    Output,
    PageMove,
    RequestTooLarge,
    Scheduler,
    StaleOutput,
    StateMove,
    UnknownRequest,
    chain,
    encode_kv_events,
)
from ._native import __version__  # noqa: F401  (the crate's version)

__all__ = [
    "AdapterError",
    "Buffers",
    "CapacityError",
    "Capture",
    "DeadlockError",
    "Delta",
    "DuplicateRequest",
    "ENTRY_DTYPE",
    "ENTRY_FORMAT",
    "Entry",
    "KvEvent",
    "KvschedError",
    "Output",
    "PageMove",
    "ReferenceShapedScheduler",
    "RequestSpec",
    "RequestTooLarge",
    "Scheduler",
    "SchedulerOutput",
    "StaleOutput",
    "StateMove",
    "UnknownRequest",
    "chain",
    "encode_kv_events",
    "ids",
]

#: One packed entry of a ``Buffers`` or ``Delta`` list (``struct`` format, little-endian, 24 bytes):
#: id, lora_task, tokens, slot, has_lora, last.
ENTRY_FORMAT = "<QQIHBB"
#: The same as a numpy dtype description: ``numpy.frombuffer(buf, dtype=ENTRY_DTYPE)``.
ENTRY_DTYPE = [("id", "<u8"), ("lora_task", "<u8"), ("tokens", "<u4"), ("slot", "<u2"),
               ("has_lora", "u1"), ("last", "u1")]


def ids(buf: bytes) -> memoryview:
    """The request ids of a packed list, as a view (no copy): every third u64."""
    return memoryview(buf).cast("Q")[0::3]


@_dataclass
class RequestSpec:
    """A request as plain data: ``spec.submit_to(scheduler)`` submits it (``Scheduler.submit``'s fields)."""

    id: int
    prompt: int
    max_new_tokens: int = 0
    lora_task: _Optional[int] = None
    beam: int = 1
    draft: int = 0
    #: "plain", "context_only" (disaggregated prefill) or "disagg_generation" (its KV arrives by transfer).
    kind: str = "plain"
    #: The prompt's block hashes, one per full page (prefix reuse).
    hashes: _Optional[_List[int]] = None
    cache_salt: int = 0
    priority: int = 0
    arrival: int = 0

    def submit_to(self, scheduler: Scheduler) -> None:
        args = _asdict(self)
        scheduler.submit(args.pop("id"), args.pop("prompt"), **args)


@_dataclass
class SchedulerOutput:
    """The reference's scheduler result (``scheduler.py SchedulerOutput``), holding request objects."""

    context_requests: _List[_Any] = _field(default_factory=list)
    generation_requests: _List[_Any] = _field(default_factory=list)
    paused_requests: _List[_Any] = _field(default_factory=list)
    recompute_paused_requests: _List[_Any] = _field(default_factory=list)
    fitting_disagg_gen_init_requests: _List[_Any] = _field(default_factory=list)
    num_fitting_requests: int = 0
    #: Context chunk sizes by request id (the reference keeps them on the request objects).
    chunk_tokens: _Dict[int, int] = _field(default_factory=dict)
    #: Adapters to load onto the device before the step (task ids).
    adapter_loads: _List[int] = _field(default_factory=list)
    #: Page copies to run before the step.
    page_moves: _List[_Any] = _field(default_factory=list)


class ReferenceShapedScheduler:
    """A ``Scheduler`` behind the reference's calling convention.

    Requests are the engine's own objects; ``id_of`` reads a request's id from one (default: its
    ``py_request_id`` attribute, else ``request_id``). ``add_request`` submits one (keyword arguments go
    to ``Scheduler.submit``); ``schedule_request`` runs a pass (and the adapter plan) and returns the
    lists with those objects; ``complete_step`` and ``finish`` follow the executor's step.
    """

    def __init__(self, scheduler: Scheduler, id_of=None):
        self.scheduler = scheduler
        self._id_of = id_of or (lambda r: getattr(r, "py_request_id", getattr(r, "request_id", None)))
        self._requests: _Dict[int, _Any] = {}
        self._inflight: set = set()

    def add_request(self, request: _Any, spec: RequestSpec) -> None:
        """Submits ``spec`` for the engine's ``request`` (its id must be ``spec.id``)."""
        rid = self._id_of(request)
        if rid != spec.id:
            raise ValueError(f"the request's id {rid} is not the spec's {spec.id}")
        spec.submit_to(self.scheduler)
        self._requests[rid] = request

    def schedule_request(
        self, active_requests: _Iterable[_Any] = (), inflight_request_ids: _Iterable[int] = ()
    ) -> SchedulerOutput:
        # ``active_requests`` is the executor's view; the scheduler keeps its own, in arrival order.
        del active_requests
        inflight = set(inflight_request_ids)
        for rid in self._inflight - inflight:
            if rid in self._requests:
                self.scheduler.set_inflight(rid, False)
        for rid in inflight - self._inflight:
            if rid in self._requests:
                self.scheduler.set_inflight(rid, True)
        self._inflight = inflight & set(self._requests)
        out = self.scheduler.schedule()
        loads = self.scheduler.ensure_batch()
        moves = self.scheduler.take_moves()
        req = self._requests
        return SchedulerOutput(
            context_requests=[req[e.id] for e in out.context],
            generation_requests=[req[e.id] for e in out.generation],
            paused_requests=[req[e.id] for e in out.paused],
            recompute_paused_requests=[req[e.id] for e in out.recompute_paused],
            fitting_disagg_gen_init_requests=[req[e.id] for e in out.disagg],
            num_fitting_requests=len(out.context) + len(out.generation),
            chunk_tokens={e.id: e.tokens for e in out.context},
            adapter_loads=loads,
            page_moves=moves,
        )

    def complete_step(self) -> None:
        self.scheduler.complete_step()

    def finish(self, request: _Any) -> None:
        rid = self._id_of(request)
        self.scheduler.finish(rid)
        self._requests.pop(rid, None)
        self._inflight.discard(rid)
