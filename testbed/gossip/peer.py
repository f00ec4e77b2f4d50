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

With emulated peers (--real-workers K < N) a real worker does the same for every position of
its segment (testbed.gossip.segment): each peer's replica steps with a copy of the worker's
gradient (its own optimizer state), its models leave its own NIC when its copy is ready (the
worker's send time plus the peer's straggler delay beyond the worker's), and every position's
ingress takes its neighbours' models in departure order. The segment's positions start a
round together, when the last of them holds its neighbours' models: a real cluster's peer
would start as soon as it held its own, which differs only where a straggler sits inside
the segment (the emulated round then ends no earlier than the real one would).

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
from testbed.gossip.segment import Segment
from testbed.gossip.topology import mix, pairwise_partner
from testbed.runtime import remote
from testbed.runtime.transport import Mailbox, Wire
from testbed.runtime.turns import Turns
from testbed.runtime.worker import WorkerBase
from testbed.training.optim import Optimizer, optimizer_for


class GossipPeer(WorkerBase):
    def __init__(self, config: Any, rank: int, device: str = "cpu", cpus: float = 1.0) -> None:
        super().__init__(config, rank, device, cpus)
        self.n = config.workers
        # the positions it plays and where their models go (its own alone unless --real-workers < N)
        self.seg = Segment(config.gossip.topology, self.n, config.real_workers, self.index)
        self.nbrs = self.seg.nbrs
        self.wire = Wire(half=config.compression.kind == "fp16")
        self.mailbox = Mailbox()
        self.peers: list[Any] = []
        self.inflight: list[Any] = []
        self.lock = threading.Lock()
        self.turns = Turns()  # the driver queues a worker's next round behind this one (testbed.runtime.turns)
        self.x = self.workload.get_params()
        self.version = 0
        self.optimizer = Optimizer(optimizer_for(config.workload))  # this replica's own state
        # the emulated peers' replicas and optimizer states (testbed.gossip.segment)
        self.peer_x = [self.x.copy() for _ in range(self.segment)]
        self.peer_opt = [Optimizer(optimizer_for(config.workload)) for _ in range(self.segment)]

    # ---- wiring and replica access
    def connect(self, peers: list[Any]) -> None:
        """The real workers, by index."""
        self.peers = peers

    def deliver(self, tag: Any, models: dict[int, np.ndarray], stamps: list[tuple[int, int, float | None]]) -> None:
        """Called by another real worker: its positions' models and (from, to, departure) stamps."""
        self.mailbox.put(tag, (models, stamps))

    def get_params(self) -> np.ndarray:
        with self.lock:
            return self.x.copy()

    def get_replicas(self) -> list[np.ndarray]:
        """Every replica it holds, in position order: its own, then its emulated peers'."""
        with self.lock:
            return [self.x.copy(), *(x.copy() for x in self.peer_x)]

    def set_params(self, flat: np.ndarray) -> None:
        with self.lock:
            self.x = np.array(flat, dtype=np.float32, copy=True)
            self.peer_x = [self.x.copy() for _ in range(self.segment)]
        self.workload.set_params(self.x)

    def _logical(self, payload: np.ndarray) -> int:
        return int(payload.nbytes * self.logical_factor)

    # ---- one local SGD step
    def _local_step(self, iteration: int) -> tuple[dict[str, Any], np.ndarray]:
        with self.lock:
            snapshot, version_read = self.x.copy(), self.version
        self.workload.set_params(snapshot)
        grad, info = self.compute(iteration)
        grad = np.asarray(grad, np.float32)
        t0 = time.time()
        # --on-nan: a non-finite gradient is never applied (skip) or ends the run (stop)
        info["skipped"] = not self.nan.admit(grad, f"worker {self.rank} iteration {iteration}'s gradient")
        with self.lock:
            info["version_read"], info["version_applied"] = version_read, self.version
            if not info["skipped"]:
                self.optimizer.step(self.x, grad)
                self.version += 1
        info["t_applied"] = time.time()
        self.span("apply", t0, info["t_applied"])
        return info, grad

    # ---- synchronous gossip
    def sync_step(self, iteration: int) -> dict[str, Any]:
        """Local step, send the model to every neighbour, mix their step-`iteration` models; the
        same for every emulated peer it plays (testbed.gossip.segment)."""
        self.turns.wait(iteration, self.config.cluster.timeout_s, lambda: False, f"gossip worker {self.rank}")
        out = self._round(iteration)
        self.turns.ended(iteration)
        return out

    def _round(self, iteration: int) -> dict[str, Any]:
        info, grad = self._local_step(iteration)
        t0 = time.time()
        mine = self.get_params()
        payloads = {self.rank: self.wire.encode(mine)}
        nbytes = self._logical(payloads[self.rank])
        # its models leave now; each peer's when its copy of the gradient is ready (its own
        # straggler delay beyond this worker's), all back to back on their own NICs
        ready = {self.rank: time.time()}
        stepped = {self.rank: mine}
        delays = self.peer_delays(iteration)
        for i, p in enumerate(self.seg.positions[1:]):
            if not info["skipped"]:
                self.peer_opt[i].step(self.peer_x[i], grad)
            stepped[p] = self.peer_x[i]
            payloads[p] = self.wire.encode(stepped[p])
            ready[p] = ready[self.rank] + delays[i]
        departure = {(p, j): self._egress(p, nbytes, ready[p]) for p in self.seg.positions for j in self.nbrs[p]}
        for r, pairs in self.seg.outgoing.items():
            models = {p: payloads[p] for p in dict.fromkeys(p for p, _ in pairs)}
            stamps = [(p, j, departure[p, j]) for p, j in pairs]
            self.inflight.append(self.peers[r].deliver.remote(("gossip", self.index, iteration), models, stamps))
        t1 = time.time()
        self.span("send", t0, t1)
        inbox = {p: {} for p in self.seg.positions}  # to -> from -> (payload, departure)
        for p, j in self.seg.local:
            inbox[j][p] = (payloads[p], departure[p, j])
        for r in self.seg.senders:
            models, stamps = self.mailbox.take(("gossip", r, iteration), self.config.cluster.timeout_s)
            for p, j, d in stamps:
                inbox[j][p] = (models[p], d)
        t2 = time.time()
        self.span("recv", t1, t2)
        # mix while the emulated transfers are still in flight (the models are here already),
        # then wait for the last delivery: the real work hides inside the model's time
        due = self._deliveries(inbox, nbytes)
        mixed = {}
        for p in self.seg.positions:
            values = {j: self.wire.decode(payload) for j, (payload, _) in inbox[p].items()}
            values[p] = stepped[p]
            mixed[p] = mix(self.seg.rows[p], values)
        with self.lock:
            self.x, self.version = mixed[self.rank], self.version + 1
            self.peer_x = [mixed[p] for p in self.seg.positions[1:]]
        held = [mixed[p].copy() for p in self.seg.positions]
        if self.inflight:  # surface failures of this round's sends
            remote.get(self.inflight, self.config.cluster.timeout_s, f"gossip worker {self.rank}'s sends")
            self.inflight.clear()
        if due is not None:
            self.endpoint.finish(due)
        t3 = time.time()
        self.span("reduce", t2, t3)
        sent = nbytes * len(self.nbrs[self.rank])
        return self.report({**info, "comm_s": t3 - t0, "bytes_sent": sent, "bytes_recv": sent, "t_end": t3,
                            "params": held[0], "peer_params": held[1:]})

    def _egress(self, p: int, nbytes: int, at: float) -> float | None:
        """Position p's NIC sends a model at `at` (or as soon as its egress is free)."""
        if p == self.rank:
            return self.endpoint.send(nbytes, at)
        return self._nics().nics[p - self.rank - 1].reserve_egress(nbytes, at)[0]

    def _deliveries(self, inbox: dict[int, dict[int, tuple[np.ndarray, float | None]]], nbytes: int) -> float | None:
        """Each position's ingress takes its neighbours' models in departure order (reserving on
        arrival instead would let a model that left later queue ahead of one already on the
        wire, which no NIC does); return when the last position holds them all (None when the
        network is not emulated). Being past it when the round's work is done is lateness:
        what this machine added to the round (`Endpoint.finish`)."""
        due = None
        for p, got in inbox.items():
            for j in sorted(got, key=lambda j: (got[j][1] is None, got[j][1] or 0.0, j)):
                d = got[j][1]
                if p == self.rank:
                    t = self.endpoint.delivery(nbytes, d, timed=False)
                elif d is not None:
                    t = self._nics().nics[p - self.rank - 1].reserve_ingress(nbytes, d)
                else:
                    continue
                due = t if due is None else max(due, t)
        return due if self.endpoint.emulated else None

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
        info, _ = self._local_step(iteration)
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
