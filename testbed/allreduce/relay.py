"""The ring with emulated peers (`--real-workers K`): a real worker plays the peers after it.

The ring has N positions, K of them real workers (testbed.emulation.peers: real worker r at
r N // K, the m_r positions after it are its *segment* of emulated peers, each holding a copy of
its gradient g_r). Every position runs the ring's 2(N-1) steps (`ring.py`): at scatter-reduce
step s, position x sends chunk (x - s) mod N, the sum of the copies at positions x-s..x.

Data. What the segment's last peer sends at step s, the next real worker's input, is known to
the owner p (the real worker before the segment, m peers long) once p has sent step s - m:

    scatter-reduce, s < m          (s + 1) g[c]                  only the segment's copies
    scatter-reduce, s >= m         S_p(s - m) + m g[c]            p's send, m copies added
    allgather step i, i < m        S_p(s - m) + (m - i) g[c]      p's scatter send, completed
                                                                  by the peers before the chunk's
                                                                  owner
    allgather step i, i >= m       S_p(s - m)                     forwarded

(c: the chunk that message carries; S_p(j): what p sent at its step j.) So the owner computes
its segment's output itself (`Relay`), and a real link carries only what crosses from one
segment to the next real worker: messages s come in batches of m (`Outbox`, `Inbox`), so a
real worker sends about 2(N-1)/m link messages per allreduce instead of 2(N-1).

Time. Every emulated peer x follows the emulator's NIC model (testbed.emulation.network): it
sends step s once it has received step s-1 and its egress is free, and a message is delivered
a + n/B after it leaves, or n/B after the previous one to the same peer:

    E(x, 0) = max(ready_x, egress free)            E(x, s) = max(A(x, s-1), E(x, s-1) + t_{s-1})
    A(x, s) = max(E(x-1, s) + a + t_s, A(x, s-1) + t_s)      (A(x, -1): ingress free)

with E(0, s) the owner's real departures and E(m, s) what the next real worker receives. Cells
with the same s - x (an anti-diagonal) carry the same chunk, and a diagonal needs only the one
before it and one departure of the owner, so `Chain` computes one diagonal per owner step as a
max-plus prefix scan (numpy, O(m)). tests/unit/test_relay.py checks it cell by cell, and a whole
ring of emulated peers against a ring of N real positions.

No per-hop sleep: a real worker computes its departures from the model's deliveries, never from
when a message really came, and sleeps once, until its last delivery. Only real time there can
leak into what is measured, so that is what counts as late (`Endpoint.finish`): an allreduce
that ends after the model's end, by how much. A message read after its delivery time inside the
allreduce changes nothing measured, and is not counted.
Pure: no Ray.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from testbed.allreduce.ring import allgather_schedule, scatter_reduce_schedule
from testbed.emulation.network import LinkSpec
from testbed.util.split import chunk_bounds

__all__ = ["Chain", "Inbox", "Loopback", "Outbox", "Relay", "relay_allreduce"]

Message = tuple[int, float, np.ndarray]  # (step, departure, payload)


class Chain:
    """The NIC times of m emulated peers in a row after a real owner (positions 1..m, the
    owner 0): egress and ingress queues kept from one allreduce to the next."""

    def __init__(self, m: int, link: LinkSpec) -> None:
        self.m, self.link = m, link
        self.egress_free = np.full(m + 1, -math.inf)  # index x = 1..m
        self.ingress_free = np.full(m + 1, -math.inf)
        self.x = np.arange(m + 1, dtype=float)

    def begin(self, steps: int, tau: Callable[[int], float], ready: np.ndarray) -> list[tuple[int, float]]:
        """Start an allreduce of `steps` steps; `tau(d)`: the transfer time of diagonal d's chunk;
        `ready[x]`: when peer x's bucket is ready. Return (step, departure) of the messages to
        the next real worker that need none of the owner's sends (steps < m)."""
        self.steps, self.tau, self.ready = steps, tau, ready
        self.E = np.full(self.m + 1, math.nan)  # E(x, d + x) on the last diagonal d
        self.A = np.full(self.m + 1, math.nan)  # A(x, d + x - 1) on it
        out = []
        for d in range(-self.m, 0):
            got = self._diagonal(d, None)
            if got is not None:
                out.append(got)
        self.d = -1
        return out

    def advance(self, departure: float) -> tuple[int, float] | None:
        """The owner's next step left at `departure`: (step, departure) of the message the next
        real worker gets m steps later, or None past the last step."""
        self.d += 1
        return self._diagonal(self.d, departure)

    def _diagonal(self, d: int, owner: float | None) -> tuple[int, float] | None:
        m, S, a = self.m, self.steps, self.link.latency
        if m == 0:
            return (d, owner) if owner is not None and d < S else None
        ta, tp = self.tau(d), self.tau(d - 1)
        xa0, xa1 = max(1, 1 - d), min(m, S - d)  # cells A(x, d + x - 1), step in [0, S)
        xe0, xe1 = max(1, -d), min(m, S - 1 - d)  # cells E(x, d + x)
        E, A = self.E.copy(), self.A.copy()
        if d < 0:  # the step-0 cell: the peer's own bucket, its egress
            x0 = -d
            if x0 <= m:
                E[x0] = max(self.ready[x0], self.egress_free[x0])
            left = E[x0] if x0 <= m else math.nan
        else:
            left = owner
        if xa0 <= xa1:
            xs = slice(xa0, xa1 + 1)
            # the ingress before: this diagonal's A at step 0 comes after the last bucket's
            before = np.where(d + self.x[xs] - 1 <= 0, self.ingress_free[xs], self.A[xs]) + ta
            c = a + ta
            if xe0 <= xe1 and xa0 <= xe1:
                es = slice(xa0, xe1 + 1)
                u = np.maximum(before[: xe1 - xa0 + 1], self.E[es] + tp)
                k = self.x[es]
                scan = np.maximum.accumulate(u - k * c)
                E[es] = k * c + np.maximum(left - (xa0 - 1) * c, scan)
            prev = np.empty(xa1 - xa0 + 1)
            prev[0] = left
            prev[1:] = E[xa0:xa1]
            A[xs] = np.maximum(prev + c, before)
            last_a = S - d  # the cell A(x, S - 1): the ingress left for the next allreduce
            if xa0 <= last_a <= xa1:
                self.ingress_free[last_a] = A[last_a]
        last_e = S - 1 - d  # the cell E(x, S - 1): the egress left
        if xe0 <= last_e <= xe1:
            self.egress_free[last_e] = E[last_e] + ta
        self.E, self.A = E, A
        if xe0 <= m <= xe1:
            return d + m, float(E[m])
        return None


class Relay:
    """The m emulated peers after a real worker at `position` of an n-ring: their messages to
    the next real worker, data and departure (see the module docstring)."""

    def __init__(self, n: int, position: int, m: int, link: LinkSpec, logical_factor: float) -> None:
        self.n, self.p, self.m = n, position, m
        self.link, self.factor = link, logical_factor
        self.chain = Chain(m, link)

    def begin(self, g: np.ndarray, ready: np.ndarray) -> list[Message]:
        """Start one allreduce of the bucket whose gradient (this worker's, before any add) is
        `g`; `ready[x]`: when peer x (1..m) had its bucket. Returns messages 0..m-1."""
        n = self.n
        self.g, self.bounds = g, chunk_bounds(len(g), n)
        sizes = np.array([hi - lo for lo, hi in self.bounds], dtype=float)
        self._tau = sizes * g.itemsize * self.factor / self.link.bandwidth
        out = []
        for s, dep in self.chain.begin(2 * (n - 1), lambda d: self._tau[(self.p - d) % n], ready):
            lo, hi = self.bounds[self._chunk(s)]
            out.append((s, dep, (s + 1) * g[lo:hi]))
        return out

    def _chunk(self, s: int) -> int:
        """The chunk the segment's last peer (at position p + m) sends at step s."""
        x, n = self.p + self.m, self.n
        return (x - s) % n if s < n - 1 else (x + 1 - (s - n + 1)) % n

    def sent(self, j: int, chunk: np.ndarray, departure: float) -> Message | None:
        """The owner sent `chunk` at its step j, leaving at `departure`: message j + m."""
        got = self.chain.advance(departure)
        if got is None:
            return None
        s, dep = got
        m, n = self.m, self.n
        if m == 0:
            return s, dep, np.array(chunk, copy=True)
        lo, hi = self.bounds[self._chunk(s)]
        i = s - (n - 1)  # the allgather step, when >= 0
        if s < n - 1:
            payload = chunk + m * self.g[lo:hi]
        elif i < m:
            payload = chunk + (m - i) * self.g[lo:hi]
        else:
            payload = np.array(chunk, copy=True)
        return s, dep, payload


class Outbox:
    """Messages to the next real worker, sent in batches of `size` steps (batch k: steps
    k*size .. k*size + size - 1) as soon as a batch is whole, one link message each: departures
    (float64) and then the payloads, in one float32 array."""

    def __init__(self, io: Any, tag: Any, size: int, steps: int) -> None:
        self.io, self.tag, self.size, self.steps = io, tag, size, steps
        self.pending: list[Message] = []

    def add(self, message: Message) -> None:
        self.pending.append(message)
        s = message[0]
        if (s + 1) % self.size == 0 or s == self.steps - 1:
            self._flush(s // self.size)

    def _flush(self, k: int) -> None:
        deps = np.array([dep for _, dep, _ in self.pending], dtype=np.float64)
        packed = np.concatenate([deps.view(np.float32), *[p.astype(np.float32, copy=False)
                                                           for _, _, p in self.pending]])
        self.pending = []
        self.io.send((self.tag, k), None, packed)


class Inbox:
    """The batches of the real worker before (whose segment is `size` peers long): message s
    is in batch s // size, read when first needed; `arrived` is when its batch was read."""

    def __init__(self, io: Any, tag: Any, size: int, lengths: list[int]) -> None:
        self.io, self.tag, self.size, self.lengths = io, tag, size, lengths  # lengths[s]: message s
        self.k = -1
        self.batch: list[tuple[float, np.ndarray]] = []
        self.arrived = 0.0

    def take(self, s: int) -> tuple[float, np.ndarray, float]:
        k = s // self.size
        if k != self.k:
            _, packed = self.io.recv((self.tag, k))
            self.arrived = time.time()
            first, last = k * self.size, min((k + 1) * self.size, len(self.lengths))
            count = last - first
            deps = np.array(packed[: 2 * count], copy=True).view(np.float64)
            data = np.array(packed[2 * count:], copy=True)  # the link's buffer is reused
            self.batch, at = [], 0
            for t in range(first, last):
                self.batch.append((float(deps[t - first]), data[at:at + self.lengths[t]]))
                at += self.lengths[t]
            self.k = k
        dep, payload = self.batch[s - self.k * self.size]
        return dep, payload, self.arrived


class Loopback:
    """The link of a ring with one real worker: its own segment's messages come back to it."""

    def __init__(self) -> None:
        self.box: dict[Any, np.ndarray] = {}

    def send(self, tag: Any, departure: float | None, chunk: np.ndarray) -> None:
        self.box[tag] = np.array(chunk, copy=True)

    def recv(self, tag: Any) -> tuple[float | None, np.ndarray]:
        return None, self.box.pop(tag)


def relay_allreduce(buf: np.ndarray, position: int, n: int, relay: Relay, upstream: int, io: Any,
                    tag: Any, endpoint: Any, ready: float, peers_ready: np.ndarray,
                    wait: bool = True) -> tuple[int, int, float | None]:
    """Sum `buf` (float32, in place) over the n positions of a ring whose segments are emulated:
    this worker's steps at `position`, its own segment by `relay`, the segment before it
    `upstream` peers long. `ready`: when this bucket was ready here (emulated time);
    `peers_ready[x]`: when emulated peer x of its segment had it. Returns the wire bytes
    (sent, received) of this position, as a worker of an n-ring sends them, and when the
    allreduce ends in the model. Not `wait`: the sum is complete on return, and the caller
    sleeps to that end itself (`Endpoint.finish`), after work the model has no time for."""
    if n == 1:
        return 0, 0, None
    steps = 2 * (n - 1)
    bounds = chunk_bounds(len(buf), n)
    schedule = scatter_reduce_schedule(position, n) + allgather_schedule(position, n)
    out = Outbox(io, tag, max(1, relay.m), steps)
    for message in relay.begin(buf.copy() if relay.m else buf, peers_ready):
        out.add(message)
    lengths = [bounds[r][1] - bounds[r][0] for _, r in schedule]
    inbox = Inbox(io, tag, max(1, upstream), lengths)
    factor, itemsize = relay.factor, buf.itemsize
    t, sent, got = ready, 0, 0
    for s, (c_send, c_recv) in enumerate(schedule):
        lo, hi = bounds[c_send]
        departure = endpoint.send(int((hi - lo) * itemsize * factor), at=t)
        message = relay.sent(s, buf[lo:hi], departure)
        if message is not None and not relay.m:  # this position's own step s: the next one waits for it
            out.add(message)
        sent += (hi - lo) * itemsize
        dep, payload, arrived = inbox.take(s)
        # the segment's message s + m goes once this worker has read its message s: links have
        # depth one, and were every worker of the ring to send s + 1 (m = 1) before it read s, each
        # would wait for the next to read s -- which it reads only after sending s + 1 itself
        if message is not None and relay.m:
            out.add(message)
        lo, hi = bounds[c_recv]
        t = endpoint.delivery(int((hi - lo) * itemsize * factor), dep, arrived=arrived, timed=False)
        got += (hi - lo) * itemsize
        if s < n - 1:
            buf[lo:hi] += payload
        else:
            buf[lo:hi] = payload
    if wait:
        endpoint.finish(t)
    return sent, got, t
