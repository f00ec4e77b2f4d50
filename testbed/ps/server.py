"""The parameter-server shard: authoritative parameters, a version counter and the SGD step.

    worker r                         shard s (owns params[lo_s:hi_s])
      |-- pull(min_version) -------->|   blocks until version >= min_version (sync barrier)
      |<------ (params_s, version) --|
      |   compute gradient g_r
      |-- push(g_r[lo:hi], v_read, r, i) ->|  sync:  collect for v_read; at N-b: average, apply
      |<-------------------- ack ----------|  async: apply now; staleness = version - v_read

Staleness of an applied gradient = the shard's version at apply - the version the gradient was
computed from: >= 0 always, 0 for synchronous training and for one async worker.
A push is applied at most once: (worker, iteration) pairs already seen are acknowledged as
duplicates (Ray may retry a call). After `max_updates` versions the shard accepts no more.
Cost per synchronous step: a shard receives N*K/S and sends N*K/S bytes (K = gradient bytes,
S shards), all through its one NIC — the reason a single PS stops scaling.

`ShardState` is the pure, thread-safe logic; `ShardActor` wraps it for Ray with the NIC.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from testbed.config import NetworkConfig
from testbed.emulation import Endpoint


class ShardState:
    def __init__(self, params: np.ndarray, *, lr: float, sync: bool, workers: int,
                 backup: int = 0, max_updates: int | None = None) -> None:
        self.params = np.array(params, dtype=np.float32, copy=True)
        self.lr = np.float32(lr)
        self.sync, self.workers = sync, workers
        self.quorum = workers - backup
        self.max_updates = max_updates
        self.version = 0
        self.pending: list[tuple[np.ndarray, float]] = []  # sync: gradients for self.version
        self.seen: set[tuple[int, int]] = set()
        self.updates: list[dict[str, Any]] = []  # one per applied version
        self.busy_s = 0.0
        self.cv = threading.Condition()

    @property
    def finished(self) -> bool:
        return self.max_updates is not None and self.version >= self.max_updates

    def pull(self, min_version: int, timeout: float) -> tuple[np.ndarray, int, float]:
        """Return (params copy, version, seconds waited for min_version)."""
        t0 = time.perf_counter()
        with self.cv:
            if not self.cv.wait_for(lambda: self.version >= min_version or self.finished, timeout):
                raise TimeoutError(f"parameter server: version {min_version} not reached within "
                                   f"{timeout:g}s (now {self.version}); a worker may be dead or hung")
            return self.params.copy(), self.version, time.perf_counter() - t0

    def push(self, grad: np.ndarray, version_read: int, worker: int, iteration: int,
             loss: float) -> dict[str, Any]:
        """Offer a gradient; return what happened to it (applied / dropped / duplicate / late)."""
        with self.cv:
            key = (worker, iteration)
            if key in self.seen:
                return {"status": "duplicate", "version_applied": -1, "staleness": -1}
            self.seen.add(key)
            if self.finished:
                return {"status": "finished", "version_applied": -1, "staleness": -1}
            if self.sync:
                return self._push_sync(grad, version_read, loss)
            t0 = time.perf_counter()
            at = self.version
            self.params -= self.lr * grad
            self._applied(contributors=1, dropped=0, loss=loss, t0=t0)
            return {"status": "applied", "version_applied": at, "staleness": at - version_read,
                    "update": self.updates[-1]}

    def _push_sync(self, grad: np.ndarray, version_read: int, loss: float) -> dict[str, Any]:
        if version_read != self.version:  # a backup worker's late gradient for a past version
            return {"status": "dropped", "version_applied": -1, "staleness": -1}
        self.pending.append((np.asarray(grad, dtype=np.float32), loss))
        at = self.version
        if len(self.pending) >= self.quorum:
            t0 = time.perf_counter()
            total = np.zeros_like(self.params)
            for g, _ in self.pending:
                total += g
            self.params -= self.lr * (total / np.float32(len(self.pending)))
            losses = [x for _, x in self.pending]
            self.pending = []
            self._applied(contributors=len(losses), dropped=self.workers - len(losses),
                          loss=float(np.mean(losses)), t0=t0)
            return {"status": "applied", "version_applied": at, "staleness": 0, "update": self.updates[-1]}
        return {"status": "applied", "version_applied": at, "staleness": 0}

    def _applied(self, *, contributors: int, dropped: int, loss: float, t0: float) -> None:
        self.version += 1
        self.busy_s += time.perf_counter() - t0
        self.updates.append({"version": self.version, "t_applied": time.time(),
                             "contributors": contributors, "dropped": dropped, "loss": loss})
        self.cv.notify_all()

    def take_updates(self) -> list[dict[str, Any]]:
        with self.cv:
            out, self.updates = self.updates, []
            return out


class ShardActor:
    """Ray shell around ShardState: the shard's NIC (emulated or counted) and its events."""

    def __init__(self, params: np.ndarray, net: NetworkConfig, rank: int, logical_factor: float,
                 **state: Any) -> None:
        self.state = ShardState(params, **state)
        self.endpoint = Endpoint(net, f"ps{rank}")
        self.logical_bytes = int(params.size * 4 * logical_factor)
        self.t_created = time.time()

    def pull(self, min_version: int, timeout: float) -> tuple[np.ndarray, int, float, float | None]:
        params, version, waited = self.state.pull(min_version, timeout)
        departure = self.endpoint.send(self.logical_bytes)
        return params, version, waited, departure

    def push(self, grad: np.ndarray, version_read: int, worker: int, iteration: int, loss: float,
             departure: float | None) -> dict[str, Any]:
        self.endpoint.receive(self.logical_bytes, departure)
        return self.state.push(grad, version_read, worker, iteration, loss)

    def version(self) -> int:
        return self.state.version

    def get_params(self) -> np.ndarray:
        with self.state.cv:
            return self.state.params.copy()

    def take_updates(self) -> list[dict[str, Any]]:
        return self.state.take_updates()

    def stats(self) -> dict[str, Any]:
        return {"busy_s": self.state.busy_s, "bytes_in": self.endpoint.bytes_in,
                "bytes_out": self.endpoint.bytes_out, "version": self.state.version,
                "wall_s": time.time() - self.t_created}
