"""The allreduce benchmark's measurement loop: one `Runner` per worker count drives the actors
of `benchpeers.py` through every method and size.

`bench.py` is the CLI (argument checks, table, JSON) and imports this module only after the
arguments are valid, so a bad flag never starts Ray. The methods measured and the definitions
of time, algbw and busbw are in `bench.py`'s docstring.

Timing: the synchronous methods (ring, torch p2p ring, gloo, PS) start behind a gate -- the
driver picks a wall-clock instant a few milliseconds ahead, every worker sleeps until it and
stamps its arrival, start and end. One iteration's time is last end - gate: all ranks are
released together and the op ends when the slowest rank has the sum (nccl-tests' span). A
worker that wakes late because the cores are busy is contention and counts; a call that
*arrives* after the gate (slow dispatch) makes the driver widen the gate and rerun that
iteration, so driver jitter never lands in a sample. Stamps are time.time() of one machine;
across nodes they need synchronised clocks. MapReduce is
timed on the driver, which drives it.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import ray

from testbed.bench.peers import (
    ATOL_PER_RANK,
    LEFT_OUT_ON_CUDA,
    METHODS,
    PING_BYTES,
    RTOL,
    BenchPeer,
    SumServer,
    expected_sum,
    max_error,
    methods,
    process_cpu_now,
    process_cpu_s,
)
from testbed.config import ClusterConfig, RunConfig, WorkloadConfig
from testbed.runtime.cluster import Cluster
from testbed.runtime.remote import RemoteTimeout, get, kill_all

__all__ = ["LEFT_OUT_ON_CUDA", "METHODS", "ResultMismatch", "Runner", "methods"]


class ResultMismatch(RuntimeError):
    """A benchmarked allreduce did not produce the exact sum: its timings mean nothing."""
PING_WARMUP, PING_REPEATS = 30, 60


class Runner:
    """The actors for one worker count N: created once, reused for every size."""

    def __init__(self, cluster: Cluster, n: int, *, seed: int, timeout: float, device: str = "cpu") -> None:
        self.cluster, self.n, self.seed, self.timeout = cluster, n, seed, timeout
        self.margin = 0.005 + 0.001 * n
        self.retries = 0
        cfg = RunConfig(strategy="ring", workers=n, seed=seed,
                        workload=WorkloadConfig(name="synthetic", grad_mb=0.001, compute_ms=0.0),
                        cluster=ClusterConfig(timeout_s=timeout))
        self.peers: list[Any] = []
        self.server: Any = None
        try:
            for r in range(n):
                opts = cluster.options(r)
                self.peers.append(BenchPeer.options(max_concurrency=4, **opts)
                                  .remote(cfg, rank=r, cpus=opts["num_cpus"], device=device))
            self.server = SumServer.options(max_concurrency=n + 2, **cluster.options(0, server=True)).remote(n)
            host, port = get(self.peers[0].rendezvous.remote(), timeout, "rendezvous")
            p = self.peers
            nodes = get([x.node_id.remote() for x in p], timeout, "node ids")
            outs = get([x.open_link.remote(p[(r + 1) % n], nodes[(r + 1) % n]) for r, x in enumerate(p)],
                       timeout, "ring channels")
            mates = [r ^ 1 for r in range(n - n % 2)]  # ping partners: (0,1), (2,3), ...
            pings = get([p[r].open_ping.remote(p[m], nodes[m]) for r, m in enumerate(mates)], timeout,
                        "ping channels")
            get([p[r].connect_ping.remote(pings[m]) for r, m in enumerate(mates)], timeout, "ping")
            get([x.connect_all.remote(p, host, port, outs[(r - 1) % n]) for r, x in enumerate(p)], timeout,
                f"wiring {n} peers (object-store ring + torch process group)")
        except BaseException:
            self.close()
            raise

    def close(self) -> float:
        """Kill the actors; return the CPU-seconds they used (0 where /proc can't tell)."""
        try:
            pids = get([a.ping.remote() for a in [*self.peers, self.server] if a is not None],
                       self.timeout, "actor pids")
        except (RemoteTimeout, ray.exceptions.RayError):  # a dead actor must not block cleanup
            pids = []
        used = sum(process_cpu_s(pid) for pid in pids)
        kill_all(self.peers)
        if self.server is not None:
            kill_all([self.server])
            self.server = None
        return used

    def hop_latency(self, calls: bool = False, loaded: bool = False) -> list[float]:
        """One-hop latencies (RTT/2) of 4 KiB pings over a channel pair, or over actor calls
        with `calls`: between ranks 0 and 1 alone, or with `loaded` between every pair
        (0,1), (2,3), ... at once, so every peer is busy as in a ring step (all samples)."""
        pairs = range(0, self.n - 1, 2) if loaded else [0]
        tags = [("ping", calls, loaded, i) for i in range(PING_WARMUP + PING_REPEATS)]
        refs = []
        for a in pairs:
            refs += [self.peers[a].ping_rtts.remote(a + 1, tags, PING_BYTES, calls),
                     self.peers[a + 1].echo.remote(a, tags, calls)]
        out = get(refs, self.timeout, f"4 KiB pings between {len(pairs)} pair(s) of ranks")
        return [x / 2 for rtts in out[::2] for x in rtts[PING_WARMUP:]]

    def one_way(self, path: str, nbytes: int, repeats: int, warmup: int) -> list[float]:
        """One-way times of nbytes messages between ranks 0 and 1 over a calibration path
        (testbed.config.calibration): half a ping-pong's round trip over a channel pair
        ("channel") or actor calls ("call"); a simultaneous exchange over torch p2p ("torch",
        one ring hop each way, its own time)."""
        if path == "torch":
            out = get([p.torch_hops.remote(warmup + repeats, nbytes) for p in self.peers[:2]],
                      self.timeout, f"torch exchanges of {nbytes} B")
            return [max(a, b) for a, b in zip(out[0], out[1], strict=True)][warmup:]
        calls = path == "call"
        tags = [("one-way", path, nbytes, i) for i in range(warmup + repeats)]
        out = get([self.peers[0].ping_rtts.remote(1, tags, nbytes, calls),
                   self.peers[1].echo.remote(0, tags, calls)], self.timeout,
                  f"{nbytes} B pings over {path}")
        return [x / 2 for x in out[0][warmup:]]

    def load(self, nbytes: int) -> Any:
        get([p.load.remote(nbytes, self.seed) for p in self.peers], self.timeout, "buffer setup")
        self.expected = expected_sum(nbytes, self.seed, self.n)
        self.expected_ref = ray.put(self.expected)
        self.broadcast = np.zeros_like(self.expected)  # MapReduce's first broadcast
        self.margin = 0.005 + 0.001 * self.n

    def once(self, method: str, tag: Any) -> tuple[float, dict[str, Any]]:
        """One timed allreduce by `method`; return (seconds, raw stamps)."""
        if method == "driver-sum":
            return self._mapreduce()
        for _ in range(6):
            get([p.prepare.remote() for p in self.peers], self.timeout, "buffer reset")
            server_cpu = get(self.server.cpu.remote(), self.timeout, "server CPU") if method == "ps" else 0.0
            gate = time.time() + self.margin
            stamps = get([p.run.remote(method, tag, gate, self.server) for p in self.peers],
                         self.timeout, f"{method} allreduce {tag}")
            if method == "ps":
                server_cpu = get(self.server.cpu.remote(), self.timeout, "server CPU") - server_cpu
            if max(s[0] for s in stamps) <= gate:
                return max(s[2] for s in stamps) - gate, {
                    "gate": gate, "stamps": stamps, "cpu_s": sum(s[3] for s in stamps) + server_cpu}
            self.retries += 1
            self.margin = min(2 * self.margin, 1.0)
            tag = (tag, "retry", self.retries)
        raise RemoteTimeout(f"{method}: calls kept arriving after the start gate (margin {self.margin:g}s)")

    def _mapreduce(self) -> tuple[float, dict[str, Any]]:
        workers_cpu = sum(get([p.cpu.remote() for p in self.peers], self.timeout, "worker CPU"))
        c0 = process_cpu_now()
        t0 = time.perf_counter()
        ref = ray.put(self.broadcast)  # once; every worker fetches the same object
        outs = get([p.mr_round.remote(ref) for p in self.peers], self.timeout, "MapReduce round")
        total = np.array(outs[0], copy=True)
        for out in outs[1:]:
            total += out
        t1 = time.perf_counter()
        c1 = process_cpu_now()
        self.broadcast = total  # the next round broadcasts this round's result
        workers_cpu = sum(get([p.cpu.remote() for p in self.peers], self.timeout, "worker CPU")) - workers_cpu
        return t1 - t0, {"cpu_s": c1 - c0 + workers_cpu}

    def verify(self, method: str, tag: Any) -> dict[str, Any]:
        """Run `method` once and check every copy of the result against the exact sum; return
        what was compared (ResultMismatch, naming the method, if any copy differs)."""
        if method == "driver-sum":
            self.broadcast = self.expected
            self._mapreduce()
            err, ok = max_error(self.broadcast, self.expected, self.n)
            checks = get([p.check.remote(self.expected_ref, "replica") for p in self.peers],
                         self.timeout, "replica check")
        else:
            self.once(method, tag)
            err, ok = 0.0, True
            checks = get([p.check.remote(self.expected_ref, "work") for p in self.peers],
                         self.timeout, f"{method} result check")
        errs = [err] + [e for e, _ in checks]
        bad = (["driver"] if not ok else []) + [f"worker {r}" for r, (_, good) in enumerate(checks) if not good]
        if bad:
            raise ResultMismatch(f"{method} N={self.n}: the result of {', '.join(bad)} differs from the "
                                 f"exact sum (max abs error {max(errs):g}, tolerance {ATOL_PER_RANK:g}*N + "
                                 f"{RTOL:g}*|sum|)")
        return {"against": "float64 sum of the seeded buffers, rounded to float32",
                "copies": len(checks) + (method == "driver-sum"),
                "elements": int(self.expected.size), "max_abs_err": max(errs),
                "atol": ATOL_PER_RANK * self.n, "rtol": RTOL}

    def measure(self, method: str, nbytes: int, warmup: int, repeats: int) -> dict[str, Any]:
        checked = self.verify(method, (method, nbytes, "verify"))
        for i in range(warmup):
            self.once(method, (method, nbytes, "warmup", i))
        samples, raw = [], []
        for i in range(repeats):
            t, stamps = self.once(method, (method, nbytes, i))
            samples.append(t)
            raw.append(stamps)
        return {"samples_s": samples, "cpu_s": [r["cpu_s"] for r in raw], "verified": checked,
                "max_abs_err": checked["max_abs_err"], "raw": raw}
