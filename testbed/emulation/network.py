"""Emulate a NIC per endpoint so that message timing follows an alpha-beta link model.

Model (emulated mode). Every endpoint -- worker, PS shard, driver -- owns one ``Nic`` with
an egress queue and an ingress queue, each of bandwidth ``B`` bytes/s, and a link latency
``a`` seconds. A message of ``n`` logical bytes

* leaves when the sender's egress is free: ``departure = max(now, egress_free_at)``, and
  keeps the egress busy for ``n/B``: ``egress_free_at = departure + n/B``;
* is delivered no earlier than ``departure + a + n/B`` (latency plus serialisation on the
  wire) and no earlier than the receiver's ingress has been free for ``n/B``:
  ``delivery = max(departure + a + n/B, ingress_free_at + n/B)``,
  ``ingress_free_at = delivery``.

So N pushes that leave at the same instant from N different workers serialise at one
receiver (e.g. a PS shard), each arriving ``n/B`` after the previous one::

    time ->   0        a   a+n/B  a+2n/B        a+N*n/B
    worker 1  [egress n/B]
    worker 2  [egress n/B]
      ...
    worker N  [egress n/B]
    PS ingress          [ msg 1 ][ msg 2 ] ... [ msg N ]
                               ^ deliveries at a + k*n/B, k = 1..N

The sender stamps ``departure`` on the message and sleeps until ``egress_done`` (its
egress is busy); the receiver calls ``reserve_ingress`` on arrival and sleeps until
``delivery`` before handing the message on. Emulation only ever sleeps; it never spins.
Ingress slots are granted in the order the receiver reserves them (first come, first
served); ``simulate`` reserves them in departure order, as messages reach the wire.
"""

from __future__ import annotations

import fcntl
import heapq
import math
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

__all__ = ["Flows", "LinkSpec", "Nic", "simulate", "sleep_until"]


def _check_bytes(nbytes: float) -> float:
    if not (isinstance(nbytes, (int, float)) and math.isfinite(nbytes) and nbytes >= 0):
        raise ValueError(f"nbytes {nbytes!r}: must be a finite number >= 0; e.g. 4096")
    return float(nbytes)


@dataclass(frozen=True)
class LinkSpec:
    """Describe one NIC: bandwidth in bytes/s and one-way latency in seconds."""

    bandwidth: float  # bytes/s
    latency: float  # s

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bandwidth) and self.bandwidth > 0):
            raise ValueError(
                f"bandwidth {self.bandwidth!r}: must be finite and > 0 bytes/s; e.g. 1.25e9"
            )
        if not (math.isfinite(self.latency) and self.latency >= 0):
            raise ValueError(f"latency {self.latency!r}: must be finite and >= 0 s; e.g. 5e-5")

    def transfer_s(self, nbytes: float) -> float:
        """Return the time NBYTES occupy one queue: n / B."""
        return _check_bytes(nbytes) / self.bandwidth

    def one_way_s(self, nbytes: float) -> float:
        """Return the uncontended delivery time of one message: a + n / B."""
        return self.latency + self.transfer_s(nbytes)


class _Cell:
    """A NIC's six numbers behind a thread lock: egress/ingress free-at, bytes and messages."""

    SLOTS = ("egress_free_at", "ingress_free_at", "bytes_out", "bytes_in", "messages_out", "messages_in")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # -inf: an idle queue never delays anything, whatever clock origin is in use.
        self.values = [-math.inf, -math.inf, 0.0, 0.0, 0.0, 0.0]

    def __enter__(self) -> list[float]:
        self._lock.acquire()
        return self.values

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class _OneThreadCell(_Cell):
    """The same numbers for one thread only (a simulation's NICs): no lock to take."""

    def __enter__(self) -> list[float]:
        return self.values

    def __exit__(self, *exc: object) -> None:
        pass


class _SharedCell(_Cell):
    """The same numbers in a small file, locked across processes: one NIC that several processes
    of one machine send and receive through (a parameter server colocated with a worker).

    The file holds six float64; `fcntl.flock` excludes other processes and the thread lock
    other threads of this one (flock is per open file, so threads would share it)."""

    FORMAT = "<6d"

    def __init__(self, path: str) -> None:
        super().__init__()
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, struct.calcsize(self.FORMAT))

    @classmethod
    def create(cls, path: str) -> None:
        """Write an idle NIC's numbers to `path` (before any process opens it)."""
        with open(path, "wb") as fh:
            fh.write(struct.pack(cls.FORMAT, -math.inf, -math.inf, 0, 0, 0, 0))

    def __enter__(self) -> list[float]:
        self._lock.acquire()
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        self.values = list(struct.unpack(self.FORMAT, self._map[:]))
        return self.values

    def __exit__(self, *exc: object) -> None:
        self._map[:] = struct.pack(self.FORMAT, *self.values)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._lock.release()


class Nic:
    """Hold one endpoint's egress and ingress queues; safe to share between threads, and between
    the processes of one machine when `shared` names a file made by `Nic.create_shared`."""

    def __init__(self, link: LinkSpec, name: str = "", shared: str | None = None, one_thread: bool = False) -> None:
        self.link = link
        self.name = name
        self._cell = _SharedCell(shared) if shared else _OneThreadCell() if one_thread else _Cell()

    @staticmethod
    def create_shared(path: str) -> None:
        _SharedCell.create(path)

    def reserve_egress(self, nbytes: float, now: float) -> tuple[float, float]:
        """Queue NBYTES for sending at NOW; return (departure, egress_done)."""
        return self._egress(_check_bytes(nbytes), now)

    def _egress(self, nbytes: float, now: float) -> tuple[float, float]:
        busy = nbytes / self.link.bandwidth
        with self._cell as v:
            departure = max(now, v[0])
            done = departure + busy
            v[0] = done
            v[2] += nbytes
            v[4] += 1
        return departure, done

    def reserve_ingress(self, nbytes: float, departure: float) -> float:
        """Accept NBYTES that left their sender at DEPARTURE; return the delivery time."""
        return self._ingress(_check_bytes(nbytes), departure)

    def _ingress(self, nbytes: float, departure: float) -> float:
        busy = nbytes / self.link.bandwidth
        with self._cell as v:
            # On the wire: latency plus serialisation; at this NIC: wait for the previous
            # message to finish arriving, then take n/B of ingress time ourselves.
            delivery = max(departure + self.link.latency + busy, v[1] + busy)
            v[1] = delivery
            v[3] += nbytes
            v[5] += 1
        return delivery

    def counters(self) -> dict[str, float]:
        """Return a snapshot of the byte and message counters."""
        with self._cell as v:
            return dict(zip(_Cell.SLOTS[2:], v[2:], strict=True))

    def __getattr__(self, name: str) -> float:
        if name in _Cell.SLOTS:
            with self._cell as v:
                return v[_Cell.SLOTS.index(name)]
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"Nic({self.name!r}, {self.link})"


def sleep_until(
    t: float,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Sleep until wall-clock time T; return the seconds slept (0 if T has passed)."""
    slept = 0.0
    remaining = t - clock()
    while remaining > 0:
        sleep(remaining)
        slept += remaining
        before, remaining = remaining, t - clock()
        # A clock that did not move would loop forever; a real one only comes back early
        # after a signal, so one more full sleep (never a spin) is what is needed.
        if remaining >= before:
            break
    return slept


Message = tuple[Hashable, Hashable, float, float]


def simulate(messages: Iterable[Message], link: LinkSpec) -> list[float]:
    """Return the delivery time of each (sender, receiver, nbytes, ready_time) message.

    Give every endpoint a fresh ``Nic``. Egress queues are served in ascending ready time;
    ingress queues in ascending departure time, the order in which the messages would
    reach the receiver's wire (ties: input order among equal ready times, else the order they
    were ready in). The result is in input order.
    """
    batch = list(messages)
    for i, (sender, receiver, _, _) in enumerate(batch):
        if sender == receiver:
            raise ValueError(f"message {i} {batch[i]!r}: sender equals receiver; drop it")
    flows = Flows(link)
    deliveries = [0.0] * len(batch)
    # Flows reserves the ingress at departure, not at ready time: a message that leaves late
    # (its sender's egress was busy) must not hold a receiver slot ahead of ones already on the wire.
    for i, (sender, receiver, nbytes, ready) in enumerate(batch):
        flows.send(sender, receiver, nbytes, ready, lambda t, i=i: deliveries.__setitem__(i, t))
    flows.run()
    return deliveries


class Flows:
    """Messages whose sending depends on earlier deliveries (closed loops), on fresh ``Nic``s.

    ``simulate`` takes every message up front; a parameter-server worker's next push, though,
    leaves only once its replies are in and it has computed again. Here a message is sent with
    a continuation: ``send(src, dst, n, ready, then)`` calls ``then(delivery)`` when it is
    delivered, and ``then`` may send more. Events run in time order (ties in the order they
    were scheduled): a message reserves its sender's egress at its ready time and the
    receiver's ingress at its departure, the order in which it would reach the wire -- the same
    arithmetic as ``simulate``, which is this with no continuations.
    """

    def __init__(self, link: LinkSpec) -> None:
        self.link = link
        self.nics: dict[Hashable, Nic] = {}
        self._events: list[tuple[float, float, int, Callable[[float], None]]] = []
        self._seq = 0

    def nic(self, endpoint: Hashable) -> Nic:
        if endpoint not in self.nics:
            self.nics[endpoint] = Nic(self.link, name=str(endpoint), one_thread=True)
        return self.nics[endpoint]

    def at(self, t: float, then: Callable[[float], None], rank: float = 0.0) -> None:
        """Call then(t) when the simulation reaches time t; among events at the same time, lower
        `rank` first, then the order they were scheduled in."""
        heapq.heappush(self._events, (t, rank, self._seq, then))
        self._seq += 1

    def send(self, sender: Hashable, receiver: Hashable, nbytes: float, ready: float,
             then: Callable[[float], None], rank: float = 0.0) -> None:
        """Queue a message ready at `ready`; call then(delivery) once it is delivered. `rank` orders
        it at the receiver among messages that leave at the same instant (by default, the order
        they were ready in)."""
        if sender == receiver:
            raise ValueError(f"message {sender!r} -> {receiver!r}: sender equals receiver; drop it")
        nbytes, out, into = _check_bytes(nbytes), self.nic(sender), self.nic(receiver)

        def leave(t: float) -> None:
            self.at(out._egress(nbytes, t)[0], arrive, rank)

        def arrive(departure: float) -> None:
            self.at(into._ingress(nbytes, departure), then)

        self.at(ready, leave)

    def run(self) -> float:
        """Run every event; return the time of the last."""
        t = 0.0
        while self._events:
            t, _, _, then = heapq.heappop(self._events)
            then(t)
        return t
