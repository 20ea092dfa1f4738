"""The Python boundary's cost (issue 30): S1-256's steady decode through the module, the object API
(`schedule()` and every id read) beside the buffers (`schedule_buffers()` with the ids read into a list,
and as a view), the median of 2,000 passes each, interleaved in one run.

Usage: build the module in release (`cargo build --release -p kvsched-py`), lay it out as a package
(python/kvsched/ with target/release/libkvsched_py.so as kvsched/_native.abi3.so) and run
`PYTHONPATH=that-folder python3 scripts/python-boundary.py`.
"""
import time, kvsched
s = kvsched.Scheduler(tokens_per_block=32, gpu_pages=256*40, host_pages=0, max_blocks_per_request=40, max_requests=256, max_batch=256, max_num_tokens=8192, chunk_unit=512)
for i in range(256):
    s.submit(id=i, prompt=16, max_new_tokens=1000)
s.schedule(); s.ensure_batch(); s.complete_step()
def run(f, n=2000):
    ts=[]
    for _ in range(n):
        t=time.perf_counter_ns(); f(); ts.append(time.perf_counter_ns()-t)
        s.complete_step()
    ts.sort(); return ts[len(ts)//2]/1000
objs = run(lambda: [e.id for e in s.schedule().generation])
bufs = run(lambda: kvsched.ids(s.schedule_buffers().generation).tolist())
view = run(lambda: kvsched.ids(s.schedule_buffers().generation))
print(f"schedule() + every id read: {objs:.2f} us; schedule_buffers() + ids.tolist(): {bufs:.2f} us; schedule_buffers() + ids view: {view:.2f} us")
