"""vLLM 0.33's KV event structs, loaded from the pinned wheel: `vllm/distributed/kv_events.py` executed
as a module with the few vLLM modules it imports stubbed (no vLLM code is in the repository)."""

import logging
import sys
import types
import zipfile


def stub(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def load(wheel):
    for name in ["vllm", "vllm.config", "vllm.utils", "vllm.v1", "vllm.v1.core", "vllm.distributed"]:
        stub(name, __path__=[])
    stub("vllm.config.kv_events", KVEventsConfig=object)
    stub("vllm.logger", init_logger=logging.getLogger)
    none = lambda *a, **k: None
    stub("vllm.utils.network_utils", get_ip=none, get_tcp_uri=none,
         is_valid_ipv6_address=none, split_zmq_path=none)
    stub("vllm.v1.core.kv_cache_utils", ExternalBlockHash=bytes | int)
    with zipfile.ZipFile(wheel) as z:
        source = z.read("vllm/distributed/kv_events.py").decode()
    module = types.ModuleType("vllm.distributed.kv_events")
    sys.modules[module.__name__] = module
    exec(compile(source, "vllm/distributed/kv_events.py", "exec"), module.__dict__)
    return module
