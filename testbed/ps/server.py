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

import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from testbed.compression import Compressor
from testbed.config import CompressionSpec, NetworkConfig
from testbed.config.faults import Fault
from testbed.emulation.endpoint import Endpoint
from testbed.emulation.faults import FaultPlan, NanPolicy
from testbed.runtime.worker import restarted
from testbed.split import chunk_bounds


def shard_bounds(numel: int, shards: int) -> list[tuple[int, int]]:
    """Shard s owns the flat range [lo, hi) of the parameters: equal slices, balanced by bytes
    (a tensor may be split between shards)."""
    return chunk_bounds(numel, shards)


class ShardState:
    def __init__(self, params: np.ndarray, *, lr: float, sync: bool, workers: int,
                 backup: int = 0, max_updates: int | None = None, on_nan: str = "skip") -> None:
        self.params = np.array(params, dtype=np.float32, copy=True)
        self.lr = np.float32(lr)
        self.sync, self.workers = sync, workers
        self.quorum = workers - backup
        self.max_updates = max_updates
        self.version = 0
        self.pending: list[tuple[np.ndarray, float]] = []  # sync: gradients for self.version
        self.seen: set[tuple[int, int]] = set()
        self.updates: list[dict[str, Any]] = []  # one per applied version (append-only log)
        self.busy_s = 0.0
        self.epoch = 0  # bumped by a rollback: work begun before it is refused
        self.nan = NanPolicy(on_nan)
        self.cv = threading.Condition()

    @property
    def finished(self) -> bool:
        return self.max_updates is not None and self.version >= self.max_updates

    def pull(self, min_version: int, timeout: float, epoch: int = 0) -> tuple[np.ndarray, int, float]:
        """Return (params copy, version, seconds waited for min_version).

        A rollback (new epoch) wakes the waiting pull; it then returns at once.
        """
        t0 = time.perf_counter()
        with self.cv:
            ok = self.cv.wait_for(
                lambda: self.version >= min_version or self.finished or self.epoch != epoch, timeout)
            if not ok:
                raise TimeoutError(f"parameter server: version {min_version} not reached within "
                                   f"{timeout:g}s (now {self.version}); a worker may be dead or hung")
            return self.params.copy(), self.version, time.perf_counter() - t0

    def push(self, grad: np.ndarray, version_read: int, worker: int, iteration: int,
             loss: float, epoch: int = 0) -> dict[str, Any]:
        """Offer a gradient; return what happened to it.

        status: applied / dropped (late, backup workers) / nan (non-finite, never applied) /
        duplicate (retried) / finished / stale-epoch (computed before a rollback). Staleness
        and version_applied are None for a gradient that was not applied.
        """
        with self.cv:
            if epoch != self.epoch:
                return {"status": "stale-epoch", "version_applied": None, "staleness": None}
            key = (worker, iteration)
            if key in self.seen:
                return {"status": "duplicate", "version_applied": None, "staleness": None}
            self.seen.add(key)
            if self.finished:
                return {"status": "finished", "version_applied": None, "staleness": None}
            if not self.nan.admit(grad, f"worker {worker} iteration {iteration}'s gradient"):
                if not self.sync:
                    return {"status": "nan", "version_applied": None, "staleness": None}
                grad = None  # counts towards the quorum, never towards the average
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
            return {"status": "dropped", "version_applied": None, "staleness": None}
        self.pending.append((None if grad is None else np.asarray(grad, dtype=np.float32), loss))
        at = self.version
        status = "applied" if grad is not None else "nan"
        ack = {"status": status, "version_applied": at if grad is not None else None,
               "staleness": 0 if grad is not None else None}
        if len(self.pending) >= self.quorum:
            t0 = time.perf_counter()
            used = [(g, x) for g, x in self.pending if g is not None]
            if used:  # all non-finite: the version passes with the parameters unchanged
                total = np.zeros_like(self.params)
                for g, _ in used:
                    total += g
                self.params -= self.lr * (total / np.float32(len(used)))
            self.pending = []
            self._applied(contributors=len(used), dropped=self.workers - len(used),
                          loss=float(np.mean([x for _, x in used])) if used else float("nan"), t0=t0)
            ack["update"] = self.updates[-1]
        return ack

    def _applied(self, *, contributors: int, dropped: int, loss: float, t0: float) -> None:
        self.version += 1
        self.busy_s += time.perf_counter() - t0
        self.updates.append({"version": self.version, "t_applied": time.time(),
                             "contributors": contributors, "dropped": dropped, "loss": loss})
        self.cv.notify_all()

    def updates_since(self, version: int) -> list[dict[str, Any]]:
        """Update records after `version` (the driver fills gaps left by a lost ack)."""
        with self.cv:
            return [u for u in self.updates if u["version"] > version]

    # ---- checkpoints: plain npz (no pickle), written atomically
    def save(self, path: Path) -> None:
        with self.cv:
            seen = np.array(sorted(self.seen), dtype=np.int64).reshape(-1, 2)
            params, version = self.params.copy(), self.version
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as fh:
            np.savez(fh, params=params, version=np.int64(version), seen=seen)
        os.replace(tmp, path)

    def load(self, path: Path, epoch: int | None = None) -> None:
        """Restore a checkpoint; a new epoch (all shards get the driver's) voids work in flight."""
        with np.load(path, allow_pickle=False) as ck, self.cv:
            self.params = ck["params"].astype(np.float32)
            self.version = int(ck["version"])
            self.seen = {(int(w), int(i)) for w, i in ck["seen"]}
            self.updates = [u for u in self.updates if u["version"] <= self.version]
            self.pending = []
            self.epoch = self.epoch + 1 if epoch is None else epoch
            self.cv.notify_all()


class ShardActor:
    """Ray shell around ShardState: the shard's NIC, its checkpoints and its injected faults.

    Checkpoints (`--checkpoint-every k`): after every k-th version the shard writes
    ckpt-s{rank}-v{version}.npz into the run's folder. A shard that Ray restarts after a death
    loads its newest checkpoint; the driver then rolls every shard back to the newest version
    all of them hold (`restore`), and training resumes from there. Without a checkpoint a
    restarted shard reports itself `lost` and the run stops.
    """

    def __init__(self, numel: int, net: NetworkConfig, rank: int, logical_factor: float,
                 checkpoint_dir: str | None = None, checkpoint_every: int = 0,
                 faults: tuple[Fault, ...] = (), compression: CompressionSpec | None = None,
                 **state: Any) -> None:
        # Small constructor arguments only: Ray keeps them to rerun __init__ on a restart (a large
        # array would live in the object store for that); parameters come by `set_params`.
        self.state = ShardState(np.zeros(numel, np.float32), **state)
        self.rank = rank
        self.actor = f"ps{rank}"
        self.endpoint = Endpoint(net, self.actor)
        self.logical_bytes = int(numel * 4 * logical_factor)
        self.factor = logical_factor
        self.decompressor = (Compressor(compression, numel)
                             if compression is not None and compression.kind != "none" else None)
        self.t_created = time.time()
        self.dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.every = checkpoint_every
        again = restarted()
        self.faults = FaultPlan(faults, "server", rank, again)
        self.lost = False
        self.events: list[tuple[str, str, float, float]] = []
        self._events_lock = threading.Lock()
        if again:
            versions = self.checkpoint_versions()
            if versions:
                self.state.load(self._path(versions[-1]))
            else:
                self.lost = True

    def _path(self, version: int) -> Path:
        assert self.dir is not None
        return self.dir / f"ckpt-s{self.rank}-v{version}.npz"

    def checkpoint_versions(self) -> list[int]:
        if self.dir is None or not self.dir.is_dir():
            return []
        return sorted(int(p.stem.rsplit("-v", 1)[1]) for p in self.dir.glob(f"ckpt-s{self.rank}-v*.npz"))

    def restore(self, version: int, epoch: int) -> int:
        """Roll back to the checkpoint of `version` under the driver's new epoch."""
        self.state.load(self._path(version), epoch)
        self.lost = False
        return self.state.version

    def health(self) -> dict[str, Any]:
        return {"lost": self.lost, "version": self.state.version, "epoch": self.state.epoch}

    def _span(self, phase: str, t0: float, t1: float) -> None:
        with self._events_lock:  # pushes and pulls run on concurrent actor threads
            self.events.append((self.actor, phase, t0, t1))

    def drain_events(self) -> list[tuple[str, str, float, float]]:
        with self._events_lock:
            out, self.events = self.events, []
        return out

    def pull(self, min_version: int, timeout: float, epoch: int = 0) -> tuple[Any, ...]:
        t0 = time.time()
        params, version, waited = self.state.pull(min_version, timeout, epoch)
        if waited > 0.0005:
            self._span("wait", t0, t0 + waited)
        departure = self.endpoint.send(self.logical_bytes)
        return params, version, waited, departure, self.state.epoch

    def push(self, grad: np.ndarray, version_read: int, worker: int, iteration: int, loss: float,
             departure: float | None, epoch: int = 0) -> dict[str, Any]:
        """Receive (through the NIC), decompress, apply or hold; the ack carries this shard's
        spans so far, so a run that dies keeps the servers' timeline too."""
        t0 = time.time()
        self.endpoint.receive(int(grad.nbytes * self.factor), departure)
        t1 = time.time()
        self._span("recv", t0, t1)
        if self.decompressor is not None:
            grad = self.decompressor.decompress(grad)
        if self.faults.due(self.state.version) == "kill":
            os._exit(1)  # injected shard death, about to apply this version
        ack = self.state.push(grad, version_read, worker, iteration, loss, epoch)
        if "update" in ack:
            self._span("apply", t1, time.time())
        if self.every and "update" in ack and ack["update"]["version"] % self.every == 0:
            self.state.save(self._path(ack["update"]["version"]))
        ack["events"] = self.drain_events()
        return ack

    def version(self) -> int:
        return self.state.version

    def get_params(self) -> np.ndarray:
        with self.state.cv:
            return self.state.params.copy()

    def set_params(self, params: np.ndarray) -> None:
        """The initial parameters of this shard's slice (before any worker connects)."""
        with self.state.cv:
            np.copyto(self.state.params, params)

    def updates_since(self, version: int) -> list[dict[str, Any]]:
        return self.state.updates_since(version)

    def ping(self) -> int:
        return os.getpid()

    def stats(self) -> dict[str, Any]:
        return {"busy_s": self.state.busy_s, "bytes_in": self.endpoint.bytes_in,
                "late_s": self.endpoint.late_s,
                "bytes_out": self.endpoint.bytes_out, "version": self.state.version,
                "wall_s": time.time() - self.t_created}
