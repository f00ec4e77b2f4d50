"""One partition of the parameter server, pure and thread-safe: its authoritative parameters,
version counter and optimizer state (`ShardState`). The Ray shell around a server's partitions,
with its NIC, is `server.py`, whose docstring draws the protocol.

A synchronous version averages its gradients in worker order, whatever order they arrived in
(`testbed.training.optim.mean_gradient`, the MapReduce driver's too), so a run is reproducible to the
bit. The update is the run's optimizer (`testbed.training.optim`: sgd, momentum or adam), whose state for the
partition lives here beside its parameters (and in its checkpoints): every rule is elementwise,
so partitions stepped apart equal the whole vector stepped at once.
Staleness of an applied gradient = the partition's version at apply - the version the gradient
was computed from: >= 0 always, 0 for synchronous training and for one async worker.
A push is applied at most once: (worker, iteration) pairs already seen are acknowledged as
duplicates (Ray may retry a call). After `max_updates` versions a partition accepts no more.
With emulated peers a push counts once per position it stands for (`copies`): a version's mean
sums N gradients in position order.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from testbed.emulation.faults import NanPolicy
from testbed.training.optim import Optimizer, OptimizerSpec, mean_gradient, to_numpy_state


def push_staleness(acks: Sequence[dict[str, Any]]) -> int | None:
    """What one worker's push says, from its partitions' acks (in partition order): its
    staleness, the largest over its partitions, where it was applied, else None.

    A duplicate of a push that counted stands for that push. The push was applied where
    partition 0 applied it (its versions are the model's, as for the update records) and every
    other partition applied it too, or had already finished: at the end of an asynchronous run
    each partition stops at --steps updates of its own, and the pushes then in flight reach some
    partitions before and some after their last one (ps-async --workers 16 --steps 4 --ps-shards
    8 counted none of its 16 pushes applied, and said 0 samples/s, where partition 0 applied four).
    """
    counted = [a["status"] == "applied" or (a["status"] == "duplicate" and a["version_applied"] is not None)
               for a in acks]
    if not counted[0] or not all(c or a["status"] == "finished" for c, a in zip(counted, acks, strict=True)):
        return None
    return max(a["staleness"] for a, c in zip(acks, counted, strict=True) if c)


class ShardState:
    def __init__(self, params: np.ndarray, *, optimizer: OptimizerSpec, sync: bool, workers: int,
                 backup: int = 0, max_updates: int | None = None, on_nan: str = "skip",
                 snapshot_every: int = 0) -> None:
        self.params = np.array(params, dtype=np.float32, copy=True)
        self.opt = Optimizer(optimizer)
        self.snapshot_every = snapshot_every  # keep the parameters of every k-th version (evaluation)
        self.snapshots: dict[int, np.ndarray] = {}
        self.sync, self.workers = sync, workers
        self.quorum = workers - backup
        self.max_updates = max_updates
        self.version = 0
        self.pending: list[tuple[int, np.ndarray | None, float]] = []  # sync: (worker, gradient, loss) for self.version
        self.arrived: list[tuple[float, int]] = []  # sync: (delivery time, worker) of those gradients
        self.seen: set[tuple[int, int]] = set()
        # (worker, iteration) -> (version read, version applied, staleness) of a push that counted
        self.counted: dict[tuple[int, int], tuple[int, int | None, int | None]] = {}
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
             loss: float, epoch: int = 0, delivered: float = 0.0,
             copies: Sequence[tuple[float, int]] = ()) -> dict[str, Any]:
        """Offer a gradient (delivered at `delivered`); return what happened to it. `copies`:
        (delivery, position) of the same gradient pushed by the worker's emulated peers (sync
        only, testbed.emulation.peers): each counts towards the version as a worker of its own.

        status: applied / dropped (late, backup workers) / nan (non-finite, never applied) /
        duplicate (retried) / finished / stale-epoch (computed before a rollback). Staleness
        and version_applied are None for a gradient that was not applied. The ack of the push
        that completes a synchronous version carries `contributors`: the workers whose
        gradients counted, in the order they were delivered (the order replies go out).
        A duplicate of a push that counted says what that first push read and where it was
        applied (`version_read`): the iteration is done, with the first push's gradient.
        """
        with self.cv:
            if epoch != self.epoch:
                return {"status": "stale-epoch", "version_applied": None, "staleness": None}
            key = (worker, iteration)
            if key in self.seen:
                if key not in self.counted:
                    return {"status": "duplicate", "version_applied": None, "staleness": None}
                read, at, stale = self.counted[key]
                return {"status": "duplicate", "version_read": read, "version_applied": at, "staleness": stale}
            self.seen.add(key)
            ack = self._offer(grad, version_read, worker, iteration, loss, delivered, copies)
            if ack["status"] in ("applied", "nan"):
                self.counted[key] = (version_read, ack["version_applied"], ack["staleness"])
            return ack

    def _offer(self, grad: np.ndarray, version_read: int, worker: int, iteration: int,
               loss: float, delivered: float, copies: Sequence[tuple[float, int]]) -> dict[str, Any]:
        """A new push, under the lock: apply it (async) or count it towards the version (sync)."""
        if self.finished:
            return {"status": "finished", "version_applied": None, "staleness": None}
        if not self.nan.admit(grad, f"worker {worker} iteration {iteration}'s gradient"):
            if not self.sync:
                return {"status": "nan", "version_applied": None, "staleness": None}
            grad = None  # counts towards the quorum, never towards the average
        if self.sync:
            return self._push_sync(grad, version_read, loss, [(delivered, worker), *copies])
        t0 = time.perf_counter()
        at = self.version
        self.opt.step(self.params, grad)
        self._applied(contributors=1, dropped=0, loss=loss, t0=t0)
        return {"status": "applied", "version_applied": at, "staleness": at - version_read,
                "update": self.updates[-1]}

    def _push_sync(self, grad: np.ndarray, version_read: int, loss: float,
                   arrivals: list[tuple[float, int]]) -> dict[str, Any]:
        """`arrivals`: (delivery, position) of the pusher and of each emulated peer it plays."""
        if version_read != self.version:  # a backup worker's late gradient for a past version
            return {"status": "dropped", "version_applied": None, "staleness": None}
        g = None if grad is None else np.asarray(grad, dtype=np.float32)
        self.pending.extend((x, g, loss) for _, x in arrivals)
        self.arrived.extend(arrivals)
        at = self.version
        status = "applied" if grad is not None else "nan"
        ack = {"status": status, "version_applied": at if grad is not None else None,
               "staleness": 0 if grad is not None else None}
        if len(self.pending) >= self.quorum:
            t0 = time.perf_counter()
            used = [(g, x) for _, g, x in sorted(self.pending, key=lambda p: p[0]) if g is not None]
            if used:  # all non-finite: the version passes with the parameters unchanged
                self.opt.step(self.params, mean_gradient([g for g, _ in used]))
            self.pending = []
            ack["contributors"] = [w for _, w in sorted(self.arrived)]
            self.arrived = []
            self._applied(contributors=len(used), dropped=self.workers - len(used),
                          loss=float(np.mean([x for _, x in used])) if used else float("nan"), t0=t0)
            ack["update"] = self.updates[-1]
        return ack

    def _applied(self, *, contributors: int, dropped: int, loss: float, t0: float) -> None:
        self.version += 1
        if self.snapshot_every and (self.version % self.snapshot_every == 0 or self.finished):
            self.snapshots[self.version] = self.params.copy()
        self.busy_s += time.perf_counter() - t0
        self.updates.append({"version": self.version, "t_applied": time.time(),
                             "contributors": contributors, "dropped": dropped, "loss": loss})
        self.cv.notify_all()

    def snapshot(self, version: int, timeout: float) -> np.ndarray:
        """The parameters right after `version` was applied (kept for evaluation), once it is;
        version 0 is the initial parameters (`ShardActor.set_params`). Taken once: then dropped."""
        with self.cv:
            if not self.cv.wait_for(lambda: version in self.snapshots, timeout):
                raise TimeoutError(f"parameter server: version {version} was not applied within {timeout:g}s")
            return self.snapshots.pop(version)

    def updates_since(self, version: int) -> list[dict[str, Any]]:
        """Update records after `version` (the driver fills gaps left by a lost ack)."""
        with self.cv:
            return [u for u in self.updates if u["version"] > version]

    # ---- checkpoints: plain npz (no pickle), written atomically
    def save(self, path: Path) -> None:
        with self.cv:
            seen = np.array(sorted(self.seen), dtype=np.int64).reshape(-1, 2)
            params, version = self.params.copy(), self.version
            state = to_numpy_state(self.opt.state_dict())
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as fh:
            np.savez(fh, params=params, version=np.int64(version), seen=seen,
                     **{f"opt_{k}": np.asarray(v) for k, v in state.items()})
        os.replace(tmp, path)

    def load(self, path: Path, epoch: int | None = None) -> None:
        """Restore a checkpoint; a new epoch (all shards get the driver's) voids work in flight."""
        with np.load(path, allow_pickle=False) as ck, self.cv:
            self.params = ck["params"].astype(np.float32)
            self.opt.load_state_dict({k[4:]: ck[k] for k in ck.files if k.startswith("opt_")})
            self.version = int(ck["version"])
            self.snapshots = {v: p for v, p in self.snapshots.items() if v <= self.version}
            self.seen = {(int(w), int(i)) for w, i in ck["seen"]}
            self.counted = {k: v for k, v in self.counted.items() if k in self.seen}
            self.updates = [u for u in self.updates if u["version"] <= self.version]
            self.pending, self.arrived = [], []
            self.epoch = self.epoch + 1 if epoch is None else epoch
            self.cv.notify_all()
