"""Type stubs of the native module (python/src/lib.rs)."""

from typing import Any, Dict, List, Optional, Tuple

__version__: str

class KvschedError(Exception): ...
class CapacityError(KvschedError): ...
class RequestTooLarge(KvschedError): ...
class UnknownRequest(KvschedError): ...
class DuplicateRequest(KvschedError): ...
class AdapterError(KvschedError): ...
class DeadlockError(KvschedError): ...
class StaleOutput(KvschedError): ...

class Entry:
    id: int
    lora_task: Optional[int]
    tokens: int
    last: bool
    slot: int
    state_slot: Optional[int]  # a hybrid engine's live GPU state slot; None without one

class Output:
    context: List[Entry]
    generation: List[Entry]
    paused: List[Entry]
    recompute_paused: List[Entry]
    disagg: List[Entry]
    resumed: List[Entry]
    pass_number: int
    def __repr__(self) -> str: ...

class Buffers:
    context: bytes
    generation: bytes
    paused: bytes
    recompute_paused: bytes
    disagg: bytes
    resumed: bytes
    pass_number: int

class Delta:
    entered: bytes
    left: bytes
    changed: bytes
    pass_number: int

class PageMove:
    request: int
    from_host: bool
    src: int
    dst: int

class StateMove:
    request: int
    op: str  # "to_host", "to_gpu" or "restore"
    src: int
    dst: int

class Capture:
    request: int
    position: int
    slot: int

class KvEvent:
    kind: str  # "stored", "removed" or "cleared"
    tier: str  # "gpu" or "host"
    key: int
    parent: int

def chain(parent: int, hash: int) -> int: ...
def encode_kv_events(
    events: List[Dict[str, Any]], ts: float, data_parallel_rank: int = 0
) -> bytes: ...

class Scheduler:
    def __init__(
        self,
        *,
        tokens_per_block: int = 32,
        gpu_pages: int = 4096,
        host_pages: int = 8192,
        max_blocks_per_request: int = 256,
        max_requests: int = 256,
        max_batch: int = 256,
        max_num_tokens: int = 8192,
        chunk_unit: int = 512,
        recompute_pause: bool = True,
        prefix_cache: bool = True,
        adapter_device_pages: int = 64,
        adapter_host_pages: int = 1024,
        kv_events: int = 0,
        admission: str = "fcfs",
        itl_target_us: int = 0,
        step_cost: Optional[Tuple[int, int, int, int, int]] = None,
        shares: Optional[List[Tuple[int, int, int]]] = None,
        state_slot_bytes: int = 0,
        state_gpu_slots: int = 0,
        state_host_slots: int = 0,
        state_snapshot_slots: int = 0,
        state_snapshot_interval: int = 0,
    ) -> None: ...
    def register_adapter(self, task: int, pages: int) -> None: ...
    def submit(
        self,
        id: int,
        prompt: int,
        *,
        max_new_tokens: int = 0,
        lora_task: Optional[int] = None,
        beam: int = 1,
        draft: int = 0,
        kind: str = "plain",
        hashes: Optional[List[int]] = None,
        cache_salt: int = 0,
        priority: int = 0,
        arrival: int = 0,
        service_class: int = 0,
    ) -> None: ...
    def schedule(self) -> Output: ...
    def schedule_buffers(self) -> Buffers: ...
    def take_delta(self) -> Delta: ...
    def ensure_batch(self) -> List[int]: ...
    def take_moves(self) -> List[PageMove]: ...
    def take_state_moves(self) -> List[StateMove]: ...
    def take_captures(self) -> List[Capture]: ...
    def complete_step(self) -> None: ...
    def page_table(self, id: int) -> List[int]: ...
    def fork(
        self,
        parent: int,
        id: int,
        prompt: int,
        *,
        max_new_tokens: int = 0,
        lora_task: Optional[int] = None,
    ) -> int: ...
    def finish(self, id: int) -> None: ...
    def set_inflight(self, id: int, inflight: bool) -> None: ...
    def end_send(self, id: int, delivered: bool = True) -> None: ...
    def start_receive(self, id: int) -> None: ...
    def end_receive(self, id: int, delivered: bool = True) -> None: ...
    def take_kv_events(self) -> List[KvEvent]: ...
    def prefix_root(self, id: int) -> int: ...
    @property
    def gpu_free(self) -> int: ...
    def __len__(self) -> int: ...
