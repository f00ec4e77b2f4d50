"""The allreduce benchmark's Ray side: the peer and server actors and the per-N measurement loop.

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

import os
import threading
import time
from typing import Any

import numpy as np
import ray

from testbed.allreduce.channels import Link, Outgoing
from testbed.allreduce.peer import ObjectStoreTransport, RingPeer, ring_allreduce
from testbed.cluster import Cluster
from testbed.config import ClusterConfig, RunConfig, WorkloadConfig
from testbed.remote import RemoteTimeout, get, kill_all
from testbed.worker import limit_threads

METHODS = ("ring-objstore", "ring-calls", "ring-torch", "gloo", "ps", "mapreduce")
GATED = ("ring-objstore", "ring-calls", "ring-torch", "gloo", "ps")
OBJSTORE = ("ring-objstore", "ring-calls")
PING_BYTES = 4096
PING_WARMUP, PING_REPEATS = 30, 60
RTOL = 1e-5


def make_data(nbytes: int, seed: int, rank: int) -> np.ndarray:
    """Worker rank's float32 buffer of nbytes/4 seeded standard-normal elements."""
    rng = np.random.default_rng([seed, nbytes, rank])
    return rng.standard_normal(nbytes // 4, dtype=np.float32)


def expected_sum(nbytes: int, seed: int, n: int) -> np.ndarray:
    """The exact answer, accumulated in float64 and rounded once."""
    total = np.zeros(nbytes // 4, dtype=np.float64)
    for r in range(n):
        total += make_data(nbytes, seed, r)
    return total.astype(np.float32)


def max_error(result: np.ndarray, expected: np.ndarray, n: int) -> tuple[float, bool]:
    """(max |result - expected|, within tolerance); float32 sums in another order round differently."""
    if result.shape != expected.shape:
        return float("inf"), False
    if result.size == 0:
        return 0.0, True
    diff = np.abs(result.astype(np.float64) - expected)
    atol = 1e-5 * n
    ok = bool(np.all(diff <= atol + RTOL * np.abs(expected)))
    return float(diff.max()), ok


def system_cpu_s() -> float | None:
    """CPU-seconds all cores have been busy since boot (Linux /proc/stat; None elsewhere)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def process_cpu_s(pid: int) -> float:
    """CPU-seconds (user + system) process pid has used; 0 if it is not on this machine."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            v = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu_now() -> float:
    """CPU-seconds this process (all its threads) has used, at nanosecond resolution."""
    return time.process_time()


def busy_fraction(seconds: float) -> float | None:
    """Share of all CPUs busy over the next `seconds` (a quiet-machine check)."""
    a = system_cpu_s()
    time.sleep(seconds)
    b = system_cpu_s()
    return None if a is None or b is None else (b - a) / (seconds * (os.cpu_count() or 1))


class _SumServer:
    """One PS shard with sum semantics: N pushes per round are added, every pull gets the sum."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.cv = threading.Condition()
        self.rounds: dict[Any, list[Any]] = {}  # tag -> [sum, pushes, pulls]

    def push(self, tag: Any, buf: np.ndarray) -> None:
        with self.cv:
            state = self.rounds.setdefault(tag, [None, 0, 0])
            if state[0] is None:
                state[0] = np.array(buf, copy=True)  # the arrival is a read-only store view
            else:
                state[0] += buf
            state[1] += 1
            self.cv.notify_all()

    def ping(self) -> int:
        return os.getpid()

    def cpu(self) -> float:
        return process_cpu_now()

    def pull(self, tag: Any, timeout: float) -> np.ndarray:
        with self.cv:
            if not self.cv.wait_for(lambda: self.rounds.get(tag, [None, 0])[1] >= self.n, timeout):
                raise RemoteTimeout(f"PS round {tag}: not all {self.n} pushes arrived within {timeout:g}s")
            state = self.rounds[tag]
            state[2] += 1
            if state[2] == self.n:
                del self.rounds[tag]
            return state[0]


class _BenchPeer(RingPeer):
    """A ring peer that allreduces a seeded buffer by each method on command (no training)."""

    def __init__(self, config: RunConfig, rank: int, cpus: float = 1.0) -> None:
        super().__init__(config, rank, "cpu", cpus)
        limit_threads(cpus)  # one torch thread per worker: contention, not oversubscription
        self.timeout = config.cluster.timeout_s
        self.data = np.zeros(0, np.float32)
        self.work = np.zeros(0, np.float32)
        self.replica = np.zeros(0, np.float32)

    def connect_all(self, peers: list[Any], host: str, port: int, left_channel: Any) -> None:
        """Object-store ring (channels, and one actor call per chunk), torch process group and
        the torch p2p ring, all to the same peers."""
        self.peers = peers
        self.connect_ring(peers, left_channel)
        self.os_transport = self.transport
        self.call_transport = ObjectStoreTransport(self.transport.right, self.mailbox, self.timeout,
                                                   self.endpoint, self.logical_factor)
        self.connect_torch(host, port)
        self.connect_torch_transport()
        self.torch_transport = self.transport

    def load(self, nbytes: int, seed: int) -> None:
        self.data = make_data(nbytes, seed, self.rank)
        self.work = np.empty_like(self.data)
        self.replica = np.empty_like(self.data)

    def prepare(self) -> None:
        np.copyto(self.work, self.data)  # in-place methods start from the original each time

    def cpu(self) -> float:
        return process_cpu_now()

    def run(self, method: str, tag: Any, gate: float, server: Any) -> tuple[float, float, float, float]:
        """Wait for the gate, allreduce self.work by `method`; return (arrived, start, end, cpu_s).

        cpu_s is the CPU this process (ring thread and the threads running `deliver`) used
        between start and end.
        """
        import torch
        import torch.distributed as dist

        arrived = time.time()
        time.sleep(max(0.0, gate - arrived))
        t0, c0 = time.time(), process_cpu_now()
        if method in OBJSTORE:
            transport = self.os_transport if method == "ring-objstore" else self.call_transport
            ring_allreduce(self.work, self.rank, self.n, transport, tag)
        elif method == "ring-torch":
            ring_allreduce(torch.from_numpy(self.work), self.rank, self.n, self.torch_transport, tag)
        elif method == "gloo":
            dist.all_reduce(torch.from_numpy(self.work))
        elif method == "ps":
            pushed = server.push.remote(tag, self.work)
            np.copyto(self.work, get(server.pull.remote(tag, self.timeout), self.timeout, "PS pull"))
            get(pushed, self.timeout, "PS push")
        else:
            raise ValueError(f"unknown method {method!r}")
        t1, c1 = time.time(), process_cpu_now()
        if method == "ring-calls":
            self.call_transport.settle()  # surfaces failed sends; the data has already arrived
        return arrived, t0, t1, c1 - c0

    def mr_round(self, broadcast: np.ndarray) -> np.ndarray:
        """MapReduce worker: take the driver's broadcast into the replica, return our buffer."""
        np.copyto(self.replica, broadcast)
        return self.data

    def check(self, expected: np.ndarray, what: str) -> tuple[float, bool]:
        return max_error(self.replica if what == "replica" else self.work, expected, self.n)

    def open_ping(self, reader: Any, node: str) -> Any:
        """A channel to this rank's ping partner, apart from the ring's links."""
        self._ping_out = Outgoing(reader, node, PING_BYTES)
        return self._ping_out.reader_end()

    def connect_ping(self, channel: Any) -> None:
        self.ping_link = Link(self._ping_out, channel, self.timeout, lambda: False)

    def ping_rtts(self, partner: int, tags: list[Any], nbytes: int, calls: bool) -> list[float]:
        """Round trips to `partner` through an object-store exchange: over a channel pair (the
        path of ring-objstore's steps) or over `deliver` calls (ring-calls')."""
        peer = self.peers[partner]
        if calls:
            transport = ObjectStoreTransport(peer, self.mailbox, self.timeout, self.endpoint, self.logical_factor)
        else:
            transport = ObjectStoreTransport(peer, self.mailbox, self.timeout, self.endpoint,
                                             self.logical_factor, link=self.ping_link)
        chunk = np.ones(nbytes // 4, dtype=np.float32)
        rtts = []
        for tag in tags:
            t0 = time.perf_counter()
            got = transport.exchange(tag, chunk, chunk.size)  # send to rank 1, wait for its echo
            rtts.append(time.perf_counter() - t0)
            del got  # frees the channel buffer for the next echo
        transport.settle()
        return rtts

    def echo(self, partner: int, tags: list[Any], calls: bool) -> None:
        sends = []
        for tag in tags:
            if calls:
                payload, _ = self.mailbox.take(tag, self.timeout)
                sends.append(self.peers[partner].deliver.remote(tag, payload, None))
            else:
                _, payload = self.ping_link.recv(tag)
                self.ping_link.send(tag, None, np.array(payload))  # no view held across a send
                del payload
        get(sends, self.timeout, "echo sends")


BenchPeer = ray.remote(_BenchPeer)
SumServer = ray.remote(_SumServer)


class Runner:
    """The actors for one worker count N: created once, reused for every size."""

    def __init__(self, cluster: Cluster, n: int, *, seed: int, timeout: float) -> None:
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
                                  .remote(cfg, rank=r, cpus=opts["num_cpus"]))
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

    def load(self, nbytes: int) -> Any:
        get([p.load.remote(nbytes, self.seed) for p in self.peers], self.timeout, "buffer setup")
        self.expected = expected_sum(nbytes, self.seed, self.n)
        self.expected_ref = ray.put(self.expected)
        self.broadcast = np.zeros_like(self.expected)  # MapReduce's first broadcast
        self.margin = 0.005 + 0.001 * self.n

    def once(self, method: str, tag: Any) -> tuple[float, dict[str, Any]]:
        """One timed allreduce by `method`; return (seconds, raw stamps)."""
        if method == "mapreduce":
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

    def verify(self, method: str, tag: Any) -> float:
        """Run `method` once and assert every copy of the result equals the numpy sum."""
        if method == "mapreduce":
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
        assert ok and all(good for _, good in checks), (
            f"{method} N={self.n}: result differs from the numpy sum (max abs error {max(errs):g})")
        return max(errs)

    def measure(self, method: str, nbytes: int, warmup: int, repeats: int) -> dict[str, Any]:
        err = self.verify(method, (method, nbytes, "verify"))
        for i in range(warmup):
            self.once(method, (method, nbytes, "warmup", i))
        samples, raw = [], []
        for i in range(repeats):
            t, stamps = self.once(method, (method, nbytes, i))
            samples.append(t)
            raw.append(stamps)
        return {"samples_s": samples, "cpu_s": [r["cpu_s"] for r in raw], "verified": True,
                "max_abs_err": err, "raw": raw}
