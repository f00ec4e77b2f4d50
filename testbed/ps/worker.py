"""The PS client side of a worker: compute, then push every partition and pull it back.

    iteration c (push-pull, the default)          partitions p0 p1 p2 ... on servers s(p)
      compute g on the params it holds
      push g[p0] ---> s(p0)   push g[p1] ---> s(p1)   ...    back to back on the egress
      <--- p0 of the next version  <--- p1 ...             as each partition is averaged
      (the pulls overlap the later pushes on full-duplex links; the next iteration computes on them)

Under ps-async the first iteration computes on the servers' version 0, which the driver hands
every worker when it wires them (setup, not a step: a cluster ships the initial model once, and
all N workers pulling it at once would make the first step an incast whose order is this
machine's timing). A worker pulls at the start of an iteration when it holds no parameters (its
first under ps-sync, after a restart or a rollback) and under a staleness bound, whose rule is
about what the pull may see once the driver lets the iteration start (testbed.ps.ssp), from its
second iteration on. Parameters and
gradients go directly between workers and servers, every partition in parallel; the driver only
schedules iterations. A worker with emulated peers (`--real-workers`) plays their NICs beside its
own and pushes for them too (testbed.emulation.peers).
"""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
import time
from typing import Any

import numpy as np
import ray

from testbed.emulation.endpoint import Endpoint
from testbed.emulation.network import Nic, sleep_until
from testbed.ps.partition import Partitioning
from testbed.runtime.remote import startup_timeout
from testbed.runtime.worker import WorkerBase

NIC_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def nic_file(run_id: str, rank: int) -> str:
    """Where worker `rank` keeps the NIC it shares with its colocated server (on its machine)."""
    return os.path.join(NIC_DIR, f"testbed-nic-{run_id}-{rank}")


def remove_nic_files(run_id: str) -> None:
    """Remove this machine's NIC files of a run (other machines keep their 48-byte files)."""
    for path in glob.glob(os.path.join(NIC_DIR, f"testbed-nic-{glob.escape(run_id)}-*")):
        with contextlib.suppress(OSError):
            os.unlink(path)


class PSWorker(WorkerBase):
    def make_nic(self, path: str) -> None:
        """Create (unless it exists: a restarted worker) the NIC file shared with the colocated
        server, and send through it from now on."""
        if not os.path.exists(path):
            Nic.create_shared(path)
        self.endpoint = Endpoint(self.config.network, self.actor, shared=path)

    def nic_stats(self) -> dict[str, float]:
        """Bytes this worker sent and received through its NIC (not what its colocated server did)."""
        return {"bytes_in": self.endpoint.bytes_in, "bytes_out": self.endpoint.bytes_out}

    def connect(self, servers: list[Any], parts: Partitioning, colocated: bool = False,
                initial: np.ndarray | None = None, driver_plays_peers: bool = False) -> None:
        """Wire to the servers (server `rank` is on this machine when they are colocated); `initial`:
        their version 0, which the first iteration computes on without pulling it.
        `driver_plays_peers`: the driver plays this worker's emulated peers (ps-async,
        testbed.ps.async_peers), and its pushes are its own alone."""
        self.servers, self.parts = servers, parts
        # beside the driver's emulated peers the servers queue every message in departure order
        # themselves (testbed.ps.server, `_push_beside_peers`): pushes go to Ray at once
        self.handed_early = driver_plays_peers
        if driver_plays_peers:
            self.segment = 0
        self.local = self.rank if colocated and self.rank < parts.servers else None
        # pulled params, versions, epoch
        self.held: tuple[np.ndarray, list[int], int] | None = (
            None if initial is None else (np.array(initial, copy=True), [0] * parts.count, 0))
        self.part_bytes = parts.logical_bytes(self.logical_factor)  # logical, on the wire

    @property
    def barrier_s(self) -> float:
        """How long a pull may wait for its version: that version may need a peer that is being
        restarted, so a restart's allowance, not --timeout (the driver tells a hung or dead actor
        from a waiting one by its liveness checks every --timeout, and a rollback ends the wait)."""
        return startup_timeout(self.config.cluster.timeout_s)

    def _collect(self, calls: dict[Any, int], out: list[Any], reply: Any, timeout: float,
                 until: float | None = None) -> float:
        """Take the answers of `calls` (ref -> partition) into `out` as they come, queueing each
        reply on the ingress on arrival; until wall time `until`, or until all have answered.
        Returns the latest delivery time reserved."""
        last = 0.0
        while calls:
            wait = timeout if until is None else max(0.0, until - time.time())
            done, _ = ray.wait(list(calls), num_returns=1, timeout=wait)
            if not done:
                if until is not None:
                    return last
                raise TimeoutError(f"worker {self.rank}: a parameter server did not answer within {timeout:g}s")
            p = calls.pop(done[0])
            out[p] = ray.get(done[0])
            got = reply(out[p])
            if got is not None and self.parts.server_of[p] != self.local:
                last = max(last, self.endpoint.delivery(self.part_bytes[p], got[3]))
        return last

    def _pull(self, min_version: int, epoch: int, timeout: float) -> tuple[list[Any], float]:
        calls = {self.servers[self.parts.server_of[p]].pull.remote(p, min_version, timeout, epoch, self.rank,
                                                                   self.segment): p
                 for p in range(self.parts.count)}
        pulled: list[Any] = [None] * self.parts.count
        sleep_until(self._collect(calls, pulled, lambda r: r, timeout))
        self._peers_receive(pulled)
        return pulled, max(r[2] for r in pulled)

    def _peers_receive(self, replies: list[Any]) -> None:
        """The emulated peers' copies of the replies (each reply's last field: their departures)."""
        self.peers_receive(self.part_bytes, [r[5] for r in replies])

    def _push(self, grad: np.ndarray, versions: list[int], iteration: int, loss: float, epoch: int,
              pull: float | None, peers: list[list[float]], samples: int = 0) -> tuple[list[Any], int]:
        """Queue every partition on the egress at once (a FIFO NIC queue: what a colocated server
        sends meanwhile goes behind them), then hand each to Ray at its departure -- a message is
        not on the wire before it leaves, so servers see pushes in departure order -- taking
        replies meanwhile. Beside the driver's emulated peers all go at once: the servers queue
        them by their departures themselves, and a push handed over at its departure reached
        them a Ray call after the copies that left with it (`handed_early`)."""
        timeout = self.barrier_s
        payloads = [self.outgoing(grad, lo, hi) for lo, hi in self.parts.bounds]
        departures: list[float | None] = []
        sent = 0
        for p, payload in enumerate(payloads):
            if self.parts.server_of[p] == self.local:
                departures.append(None)
                continue
            nbytes = int(payload.nbytes * self.logical_factor)
            sent += nbytes
            departures.append(self.endpoint.send(nbytes))
        calls: dict[Any, int] = {}
        acks: list[Any] = [None] * self.parts.count
        last = 0.0
        for p, (payload, departure) in enumerate(zip(payloads, departures, strict=True)):
            if departure is not None and not self.handed_early:
                last = max(last, self._collect(calls, acks, lambda a: a.get("pull"), timeout, departure))
            ref = self.servers[self.parts.server_of[p]].push.remote(
                p, payload, versions[p], self.rank, iteration, loss, departure, epoch, pull, peers[p], samples)
            calls[ref] = p
        sleep_until(max(last, self._collect(calls, acks, lambda a: a.get("pull"), timeout)))
        return acks, sent

    def iteration(self, iteration: int, min_version: int, epoch: int = 0,
                  pull_after: bool = True, start_at: float | None = None) -> dict[str, Any]:
        """[Pull,] compute, push every partition [and pull it back]; timings and the servers' acks.

        Returns {"reset": True} without computing when a server rolled back meanwhile. Parameters
        held from the last reply are used only if they are at least `min_version` (a gradient
        computed on older ones would count twice towards a version of synchronous training).
        `start_at`: begin then (the workers' common start); past it already, the delay is lateness.
        """
        timeout = self.barrier_s
        if start_at is not None:
            self.endpoint.finish(start_at)
        t0 = time.time()
        server_wait = 0.0
        if self.held is None or self.held[2] != epoch or min(self.held[1]) < min_version:
            pulled, server_wait = self._pull(min_version, epoch, timeout)
            if any(r[4] != epoch for r in pulled):
                return {"reset": True}
            self.held = (self._join([r[0] for r in pulled]), [r[1] for r in pulled], epoch)
        params, versions, _ = self.held
        t_pulled = time.time()
        if t_pulled - t0 > 0.0005:
            self.span("recv", t0, t_pulled)
        self.workload.set_params(params)
        grad, info = self.compute(iteration)
        t_pushing = time.time()
        peers = self.peers_send(self.part_bytes, t_pushing - t_pulled, iteration)
        acks, sent = self._push(grad, versions, iteration, info["loss"], epoch, timeout if pull_after else None,
                                peers, info["samples"])
        # a redone iteration whose first push counted: that push's read is the iteration's
        versions = [a.get("version_read", v) for a, v in zip(acks, versions, strict=True)]
        if self.dies_once_sent:  # --fail sent:worker=R,at=I: the servers have it, the driver never hears
            os._exit(1)
        self.held = None
        if pull_after and all("pull" in a for a in acks):
            back = [a.pop("pull") for a in acks]
            if all(r[4] == epoch for r in back):
                self.held = (self._join([r[0] for r in back]), [r[1] for r in back], epoch)
                self._peers_receive(back)
                server_wait += max(r[2] for r in back)
        t_done = time.time()
        self.span("send", t_pushing, t_done)
        recv = sum(b for p, b in enumerate(self.part_bytes) if self.parts.server_of[p] != self.local)
        return self.report({**info, "t_start": t0, "versions": versions, "acks": acks,
                            "server_wait_s": server_wait,
                            # moving bytes: the pull and push-pull spans less the longest wait at a
                            # server for the others (not clamped: a negative value would be a bug)
                            "comm_s": (t_pulled - t0) + (t_done - t_pushing) - server_wait,
                            "bytes_sent": sent, "bytes_recv": recv, "t_end": t_done})

    def _join(self, parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts) if len(parts) > 1 else parts[0]
