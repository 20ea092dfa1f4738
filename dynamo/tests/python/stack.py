"""Dynamo's frontend over two `kvsched-dynamo` workers on 127.0.0.1, for the end-to-end test and the
measurements (dynamo/tests/python/): file discovery in a folder of the run's, TCP request plane, ZMQ event
plane, every advertised host 127.0.0.1; each process's output in the work folder; everything stopped on exit.
"""

import os
import random
import re
import socket
import subprocess
import sys
import time
import urllib.request

NAME = "smollm2"
BLOCK = 16
HOSTS = ["DYN_EVENT_PLANE_HOST", "DYN_TCP_RPC_HOST", "DYN_SYSTEM_HOST", "DYN_TCP_RESPONSE_STREAM_HOST"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def low_port():
    """A free port below 32768 (Dynamo 1.6.1 reads DYN_SYSTEM_PORT as an i16)."""
    rng = random.Random()
    while True:
        port = rng.randrange(20000, 32768)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def wait_for(what, check, seconds=120, proc=None, log=None):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: exited {proc.returncode}\n{tail(log)}")
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what}: not ready in {seconds} s\n{tail(log)}")


def tail(path, lines=40):
    if not path or not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def metric(text, name):
    """The sum of a metric's samples (any labels)."""
    pattern = re.compile(r"^" + re.escape(name) + r"(\{[^}]*\})? (\S+)$", re.M)
    return sum(float(m.group(2)) for m in pattern.finditer(text))


class Stack:
    def __init__(self, worker, model, work, router_mode="kv", workers=2, worker_args=()):
        self.work = work
        os.makedirs(work, exist_ok=True)
        self.env = dict(os.environ)
        self.env.update({h: "127.0.0.1" for h in HOSTS})
        self.env.update(DYN_DISCOVERY_BACKEND="file", DYN_FILE_KV=os.path.join(work, "discovery"),
                        DYN_REQUEST_PLANE="tcp", DYN_EVENT_PLANE="zmq",
                        DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS="1", DYN_LOG="warn")
        self.worker, self.model, self.router_mode = worker, model, router_mode
        self.count, self.worker_args = workers, list(worker_args)
        self.workers, self.system_ports, self.logs = [], [], []
        self.frontend = None

    def __enter__(self):
        try:
            for i in range(self.count):
                self.start_worker(i)
            self.start_frontend()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def start_worker(self, i):
        port, events = low_port(), free_port()
        env = dict(self.env, DYN_SYSTEM_PORT=str(port))
        log = os.path.join(self.work, f"worker-{i}.log")
        cmd = [self.worker, "--model", self.model, "--served-model-name", NAME,
               "--model-dir", os.path.join(self.work, "model"), "--block-size", str(BLOCK),
               "--kv-events-port", str(events), "--drain-timeout", "60"] + self.worker_args
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.workers.append(proc)
        self.system_ports.append(port)
        self.logs.append(log)
        wait_for(f"worker {i}", lambda: "vllm:num_requests_running" in get(self.metrics_url(i))[1],
                 proc=proc, log=log)

    def start_frontend(self):
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        log = os.path.join(self.work, "frontend.log")
        cmd = [sys.executable, "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(port),
               "--router-mode", self.router_mode, "--kv-cache-block-size", str(BLOCK),
               "--discovery-backend", "file"]
        with open(log, "w") as out:
            self.frontend = subprocess.Popen(cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        wait_for("the frontend", lambda: NAME in get(self.url + "/v1/models")[1], proc=self.frontend, log=log)

    def metrics_url(self, i):
        return f"http://127.0.0.1:{self.system_ports[i]}/metrics"

    def counters(self, only=None):
        """Each worker's engine counters (prefix cache queries and hits, cancelled, running)."""
        out = {}
        for i in (range(len(self.workers)) if only is None else only):
            text = get(self.metrics_url(i))[1]
            out[i] = {"queries": metric(text, "vllm:prefix_cache_queries_total"),
                      "hits": metric(text, "vllm:prefix_cache_hits_total"),
                      "cancelled": metric(text, "kvsched:requests_cancelled_total"),
                      "running": metric(text, "vllm:num_requests_running")}
        return out

    def served_since(self, before):
        """The workers whose prefix cache was queried since `before` (a request's prompt ran there)."""
        now = self.counters(only=list(before))
        return [i for i in before if now[i]["queries"] > before[i]["queries"]]

    def __exit__(self, *exc):
        for p in [self.frontend] + self.workers:
            if p is not None and p.poll() is None:
                p.terminate()
        for p in [self.frontend] + self.workers:
            if p is None:
                continue
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return False
