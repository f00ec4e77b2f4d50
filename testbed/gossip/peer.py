"""The gossip worker: a live replica, a local SGD step, and averaging with its neighbours.

The replica `x` (flat float32) is the worker's model; the workload is only the gradient
oracle, loaded with a snapshot of `x` before each gradient. Everything that touches `x` holds
`lock`, so asynchronous averaging by a neighbour (another actor thread) never tears it.
`version` counts the changes to `x`: +1 per own SGD step, +1 per averaging.

Synchronous step t (`sync_step`), D-PSGD in adapt-then-combine form (Lian et al. 2017)::

    x_i <- x_i - lr g_i(x_i)                           local SGD step (or momentum/adam)
    send x_i to every neighbour j (tag t)              d messages of K bytes
    x_i <- sum_j W_ij x_j   (j in N(i) and i)          wait for the d step-t models, mix

There is no barrier: a worker waits only for its neighbours' step-t models, so it can run
ahead of workers farther away in the graph.

Asynchronous step (`async_step`), AD-PSGD-like pairwise averaging (Lian et al. 2018)::

    x_i <- x_i - lr g_i(snapshot)                      gradient of a snapshot; other threads
                                                        may have averaged into x_i meanwhile
    j = a seeded random neighbour
    j.average(m):  x_j <- (x_j + m) / 2, reply x_j's old value t
    x_i <- x_i + (t - m) / 2                           = (x_i + x_j) / 2 if x_i did not move

Both sides apply halves of the same difference, so the sum of the replicas (and their
average) is unchanged by averaging even when exchanges overlap. Staleness of a gradient:
averagings applied to x_i between its snapshot and its application. Bytes: an exchange is
booked on the worker that starts it, K sent and K received (its partner's NIC mirrors them).

The optimizer (testbed.training.optim) is each replica's own, with its own state; averaging mixes the
parameters only. `--compression fp16` sends models as float16 (the sender mixes its own copy unrounded).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from testbed.emulation.network import sleep_until
from testbed.gossip.topology import mix, mixing_row, neighbours, pairwise_partner
from testbed.runtime import remote
from testbed.runtime.transport import Mailbox, ObjectStoreTransport, Wire
from testbed.runtime.worker import WorkerBase
from testbed.training.optim import Optimizer, optimizer_for


class GossipPeer(WorkerBase):
    def __init__(self, config: Any, rank: int, device: str = "cpu", cpus: float = 1.0) -> None:
        super().__init__(config, rank, device, cpus)
        self.n = config.workers
        self.nbrs = neighbours(config.gossip.topology, self.n)
        self.row = mixing_row(rank, self.nbrs)
        self.wire = Wire(half=config.compression.kind == "fp16")
        self.mailbox = Mailbox()
        self.transport: Any = None
        self.peers: list[Any] = []
        self.lock = threading.Lock()
        self.x = self.workload.get_params()
        self.version = 0
        self.optimizer = Optimizer(optimizer_for(config.workload))  # this replica's own state

    # ---- wiring and replica access
    def connect(self, peers: list[Any]) -> None:
        self.peers = peers
        self.transport = ObjectStoreTransport(None, self.mailbox, self.config.cluster.timeout_s,
                                              self.endpoint, self.logical_factor, peers=peers, rank=self.rank)

    def deliver(self, tag: Any, payload: np.ndarray, departure: float | None = None) -> None:
        """Called by a neighbour: file its model with its departure stamp (see `_receive_all`)."""
        self.mailbox.put(tag, (payload, departure))

    def get_params(self) -> np.ndarray:
        with self.lock:
            return self.x.copy()

    def set_params(self, flat: np.ndarray) -> None:
        with self.lock:
            self.x = np.array(flat, dtype=np.float32, copy=True)
        self.workload.set_params(self.x)

    def _logical(self, payload: np.ndarray) -> int:
        return int(payload.nbytes * self.logical_factor)

    # ---- one local SGD step
    def _local_step(self, iteration: int) -> dict[str, Any]:
        with self.lock:
            snapshot, version_read = self.x.copy(), self.version
        self.workload.set_params(snapshot)
        grad, info = self.compute(iteration)
        t0 = time.time()
        # --on-nan: a non-finite gradient is never applied (skip) or ends the run (stop)
        info["skipped"] = not self.nan.admit(grad, f"worker {self.rank} iteration {iteration}'s gradient")
        with self.lock:
            info["version_read"], info["version_applied"] = version_read, self.version
            if not info["skipped"]:
                self.optimizer.step(self.x, np.asarray(grad, np.float32))
                self.version += 1
        info["t_applied"] = time.time()
        self.span("apply", t0, info["t_applied"])
        return info

    # ---- synchronous gossip
    def sync_step(self, iteration: int) -> dict[str, Any]:
        """Local step, send the model to every neighbour, mix their step-`iteration` models."""
        info = self._local_step(iteration)
        t0 = time.time()
        mine = self.get_params()
        payload = self.wire.encode(mine)
        for j in self.nbrs[self.rank]:
            self.transport.send_to(j, iteration, payload)
        t1 = time.time()
        self.span("send", t0, t1)
        values = self._receive_all(iteration)
        t2 = time.time()
        self.span("recv", t1, t2)
        values[self.rank] = mine
        mixed = mix(self.row, values)
        with self.lock:
            self.x, self.version = mixed, self.version + 1
        self.transport.settle()
        t3 = time.time()
        self.span("reduce", t2, t3)
        nbytes = self._logical(payload) * len(self.nbrs[self.rank])
        return self.report({**info, "comm_s": t3 - t0, "bytes_sent": nbytes, "bytes_recv": nbytes,
                            "t_end": t3, "params": mixed.copy()})

    def _receive_all(self, iteration: int) -> dict[int, np.ndarray]:
        """The neighbours' step models; the emulated ingress takes them in departure order.

        Reserving on arrival instead would let a model that left later (its sender's second
        send slot) queue ahead of one already on the wire, which no NIC does.
        """
        got = {j: self.transport.take_stamped(j, iteration) for j in self.nbrs[self.rank]}
        order = sorted(got, key=lambda j: (got[j][1] is None, got[j][1] or 0.0, j))
        last = max((self.endpoint.delivery(self._logical(got[j][0]), got[j][1]) for j in order), default=0.0)
        sleep_until(last)
        return {j: self.wire.decode(payload) for j, (payload, _) in got.items()}

    # ---- asynchronous gossip
    def average(self, payload: np.ndarray, departure: float | None) -> tuple[np.ndarray, float | None]:
        """Called by a neighbour: x <- (x + theirs) / 2; reply with x's value before."""
        sleep_until(self.endpoint.delivery(self._logical(payload), departure))
        theirs = self.wire.decode(payload)
        with self.lock:
            old = self.x.copy()
            self.x += (theirs - self.x) * np.float32(0.5)
            self.version += 1
        reply = self.wire.encode(old)
        return reply, self.endpoint.send(self._logical(reply))

    def async_step(self, iteration: int) -> dict[str, Any]:
        """Local step, then average with one seeded random neighbour."""
        info = self._local_step(iteration)
        t0 = time.time()
        partner = pairwise_partner(self.rank, self.nbrs, self.config.seed, iteration)
        sent = recv = 0
        if partner is not None:
            payload = self.wire.encode(self.get_params())
            departure = self.endpoint.send(self._logical(payload))
            reply, back = remote.get(self.peers[partner].average.remote(payload, departure),
                                     self.config.cluster.timeout_s, f"gossip average with worker {partner}")
            sent, recv = self._logical(payload), self._logical(reply)
            self.endpoint.receive(recv, back)
            with self.lock:
                self.x += (self.wire.decode(reply) - self.wire.decode(payload)) * np.float32(0.5)
                self.version += 1
        t1 = time.time()
        self.span("send", t0, t1)
        return self.report({**info, "comm_s": t1 - t0, "bytes_sent": sent, "bytes_recv": recv,
                            "t_end": t1, "partner": partner, "params": self.get_params()})
