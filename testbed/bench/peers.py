"""The allreduce benchmark's actors and data: seeded buffers, the exact answer, CPU meters,
the bench peer (a RingPeer that allreduces a buffer by each method on command) and a one-shard
sum server for the PS round. `benchlib.Runner` creates and drives them; `bench.py` documents
the methods and what is measured.
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
from testbed.config import RunConfig
from testbed.runtime.remote import RemoteTimeout, get
from testbed.runtime.transport import to_numpy
from testbed.runtime.worker import limit_threads

METHODS = ("ring-objstore", "ring-calls", "ring-torch", "gloo", "ps", "driver-sum")  # all but driver-sum gated
OBJSTORE = ("ring-objstore", "ring-calls")
# On GPUs that the workers share: the buffers live on the GPU, gloo reduces CUDA tensors through
# the host, and the torch p2p ring is left out (gloo's send/recv take host tensors; NCCL refuses
# two ranks on one GPU).
CUDA_METHODS = ("ring-objstore", "ring-calls", "gloo", "ps", "driver-sum")
LEFT_OUT_ON_CUDA = {"ring-torch": "gloo's point-to-point takes host tensors and NCCL refuses two ranks on "
                                  "one GPU, so the torch p2p ring needs a GPU per worker"}


def methods(device: str) -> tuple[str, ...]:
    """The methods measured with buffers on `device` (cpu or cuda)."""
    return CUDA_METHODS if device == "cuda" else METHODS
PING_BYTES = 4096
RTOL = 1e-5
ATOL_PER_RANK = 1e-5  # float32 sums in another order round differently, by up to ~N ulps


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
    atol = ATOL_PER_RANK * n
    ok = bool(np.all(diff <= atol + RTOL * np.abs(expected)))
    return float(diff.max()), ok


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

    def __init__(self, config: RunConfig, rank: int, cpus: float = 1.0, device: str = "cpu") -> None:
        super().__init__(config, rank, "cpu", cpus)  # "cpu": its process group is gloo on any device
        limit_threads(cpus)  # one torch thread per worker: contention, not oversubscription
        self.timeout = config.cluster.timeout_s
        self.buffers = device  # where the allreduced buffers live (cuda: torch tensors on the GPU)
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
        data = make_data(nbytes, seed, self.rank)
        if self.buffers == "cuda":
            import torch

            self.data = torch.from_numpy(data).cuda()
            self.work, self.replica = torch.empty_like(self.data), torch.empty_like(self.data)
            torch.cuda.synchronize()
            return
        self.data = data
        self.work = np.empty_like(self.data)
        self.replica = np.empty_like(self.data)

    def prepare(self) -> None:
        _copy(self.work, self.data)  # in-place methods start from the original each time
        self._sync()

    def _sync(self) -> None:
        """Wait for the GPU's queued work, so that a stamp after it counts it."""
        if self.buffers == "cuda":
            import torch

            torch.cuda.synchronize()

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
        elif method == "ring-torch" and self.buffers != "cuda":
            ring_allreduce(torch.from_numpy(self.work), self.rank, self.n, self.torch_transport, tag)
        elif method == "gloo":
            dist.all_reduce(self.work if self.buffers == "cuda" else torch.from_numpy(self.work))
        elif method == "ps":
            pushed = server.push.remote(tag, to_numpy(self.work))
            _copy(self.work, get(server.pull.remote(tag, self.timeout), self.timeout, "PS pull"))
            get(pushed, self.timeout, "PS push")
        else:
            raise ValueError(f"method {method!r}: not measured with buffers on {self.buffers}")
        self._sync()
        t1, c1 = time.time(), process_cpu_now()
        if method == "ring-calls":
            self.call_transport.settle()  # surfaces failed sends; the data has already arrived
        return arrived, t0, t1, c1 - c0

    def mr_round(self, broadcast: np.ndarray) -> np.ndarray:
        """MapReduce worker: take the driver's broadcast into the replica, return our buffer."""
        _copy(self.replica, broadcast)
        return to_numpy(self.data)

    def check(self, expected: np.ndarray, what: str) -> tuple[float, bool]:
        return max_error(to_numpy(self.replica if what == "replica" else self.work), expected, self.n)

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

    def torch_hops(self, count: int, nbytes: int) -> list[float]:
        """`count` exchanges with the ring neighbour over torch p2p (both ranks at once, as a
        ring step does): each one hop of nbytes each way; the time of each."""
        chunk = np.ones(nbytes // 4, dtype=np.float32)
        times = []
        for i in range(count):
            t0 = time.perf_counter()
            self.torch_transport.exchange(("hop", i), chunk, chunk.size)
            times.append(time.perf_counter() - t0)
        return times

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


def _copy(dst: Any, src: Any) -> None:
    """dst[:] = src, for a host array or a (GPU) tensor; src a host array or a tensor."""
    if isinstance(dst, np.ndarray):
        np.copyto(dst, src)
        return
    import warnings

    import torch

    if not isinstance(src, torch.Tensor):
        with warnings.catch_warnings():  # a read-only store view: copied to the GPU, never written
            warnings.simplefilter("ignore", UserWarning)
            src = torch.from_numpy(np.asarray(src))
    dst.copy_(src)


BenchPeer = ray.remote(_BenchPeer)
SumServer = ray.remote(_SumServer)
