"""The parameter server: per partition, authoritative parameters, a version counter and the optimizer.

    worker r                          server s (holds partitions p with p mod S = s)
      |   compute gradient g_r on the params it holds
      |-- push(p, g_r[p], v_read, r, i, pull) -->|  sync:  collect for v_read; at N-b: average,
      |                                          |         apply, and send every contributor its
      |<----- ack + (params_p, v_read + 1) ------|         reply, in delivery order
      |                                          |  async: apply now (staleness = version - v_read),
      |                                          |         reply with the newest version
      |-- pull(p, min_version) ------------------>|  (first iteration, after a rollback, under SSP)
      |<-------------------- (params_p, version) -|  blocks until version >= min_version

A synchronous version averages its gradients in worker order, whatever order they arrived in
(`testbed.training.optim.mean_gradient`, the MapReduce driver's too), so a run is reproducible to the
bit. The update is the run's optimizer (`testbed.training.optim`: sgd, momentum or adam), whose state for the
partition lives here beside its parameters (and in its checkpoints): every rule is elementwise,
so partitions stepped apart equal the whole vector stepped at once.
Staleness of an applied gradient = the partition's version at apply - the version the gradient
was computed from: >= 0 always, 0 for synchronous training and for one async worker.
A push is applied at most once: (worker, iteration) pairs already seen are acknowledged as
duplicates (Ray may retry a call). After `max_updates` versions a partition accepts no more.
Cost per synchronous step: a server receives N*K*(its share) and sends as many bytes, all
through its one NIC -- the reason a single PS stops scaling (testbed.analysis.psmodel).

Emulated peers (ps-sync, `--real-workers K < N`, testbed.emulation.peers): a real worker's push
carries the departures of its peers' copies; the server queues each on its ingress
(`Endpoint.deliveries`), counts the push once per position it stands for, and sends every position
its reply. A version's mean sums N gradients in position order, the owner's once for each of its
positions, so the run equals one process stepping the owner-weighted mean
(testbed.workloads.reference).

`ShardState` is the pure, thread-safe logic of one partition; `ShardActor` wraps a server's
partitions for Ray with the NIC.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from testbed.config import CompressionSpec, NetworkConfig
from testbed.config.faultspec import Fault
from testbed.emulation.endpoint import Endpoint
from testbed.emulation.faults import FaultPlan, NanPolicy
from testbed.emulation.network import sleep_until
from testbed.runtime.worker import restarted
from testbed.training.compressor import Compressor
from testbed.training.optim import Optimizer, OptimizerSpec, mean_gradient, to_numpy_state


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


class ShardActor:
    """Ray shell around one ShardState per partition this server holds (`testbed.ps.partition`):
    the server's NIC, its checkpoints and its injected faults.

    Push-pull: a worker's push of partition p may ask for p's next version back (`pull=True`). In
    synchronous training the push that completes a version sends every contributor its reply at
    once, in the order their pushes were delivered, so the server's egress is reserved in one
    deterministic order; a late (dropped) push and asynchronous pushes reply on their own.

    Colocated (`--ps-placement colocated`): this server shares the NIC of worker `local_worker`
    (`nic`, a file that both processes open), and what the two say to each other does not touch it.

    Checkpoints (`--checkpoint-every k`): after every k-th version of a partition the server writes
    ckpt-s{rank}-p{partition}-v{version}.npz into the run's folder. A server that Ray restarts after
    a death loads, for every partition, the newest version all its partitions hold; the driver then
    rolls every server back to the newest version all of them hold (`restore`), and training
    resumes from there. Without a checkpoint a restarted server reports itself `lost` and the run
    stops.
    """

    def __init__(self, sizes: dict[int, int], net: NetworkConfig, logical_factor: float,
                 checkpoint_dir: str | None = None, checkpoint_every: int = 0,
                 faults: tuple[Fault, ...] = (), compression: CompressionSpec | None = None,
                 nic: str | None = None, local_worker: int | None = None, *, rank: int, **state: Any) -> None:
        # Small constructor arguments only: Ray keeps them to rerun __init__ on a restart (a large
        # array would live in the object store for that); parameters come by `set_params`.
        self.parts = {p: ShardState(np.zeros(n, np.float32), **state) for p, n in sizes.items()}
        self.sync = bool(state.get("sync"))
        self.rank = rank
        self.actor = f"ps{rank}"
        self.endpoint = Endpoint(net, self.actor, shared=nic)
        self.local_worker = local_worker
        self.factor = logical_factor
        self.logical = {p: int(n * 4 * logical_factor) for p, n in sizes.items()}
        self.decompressors = ({p: Compressor(compression, n) for p, n in sizes.items()}
                              if compression is not None and compression.kind != "none" else {})
        self.replies: dict[tuple[int, int, int], float | None] = {}  # (partition, version, worker)
        self.reply_cv = threading.Condition()
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
                for p, st in self.parts.items():
                    st.load(self._path(p, versions[-1]))
            else:
                self.lost = True

    def _path(self, part: int, version: int) -> Path:
        assert self.dir is not None
        return self.dir / f"ckpt-s{self.rank}-p{part}-v{version}.npz"

    def checkpoint_versions(self) -> list[int]:
        """Versions every partition of this server has a checkpoint of."""
        if self.dir is None or not self.dir.is_dir() or not self.parts:
            return []
        held = [{int(f.stem.rsplit("-v", 1)[1]) for f in self.dir.glob(f"ckpt-s{self.rank}-p{p}-v*.npz")}
                for p in self.parts]
        return sorted(set.intersection(*held))

    def restore(self, version: int, epoch: int) -> int:
        """Roll back to the checkpoint of `version` under the driver's new epoch."""
        for p, st in self.parts.items():
            st.load(self._path(p, version), epoch)
        with self.reply_cv:
            self.replies.clear()
            self.reply_cv.notify_all()
        self.lost = False
        return self.version()

    def health(self) -> dict[str, Any]:
        return {"lost": self.lost, "version": self.version(),
                "epoch": max((st.epoch for st in self.parts.values()), default=0)}

    def _span(self, phase: str, t0: float, t1: float) -> None:
        with self._events_lock:  # pushes and pulls run on concurrent actor threads
            self.events.append((self.actor, phase, t0, t1))

    def drain_events(self) -> list[tuple[str, str, float, float]]:
        with self._events_lock:
            out, self.events = self.events, []
        return out

    def _send(self, part: int, worker: int) -> float | None:
        """Queue partition `part` for `worker` on the egress; its departure (None: local)."""
        if worker == self.local_worker:  # the colocated worker: never on the NIC
            return None
        return self.endpoint.send(self.logical[part])

    def pull(self, part: int, min_version: int, timeout: float, epoch: int = 0,
             worker: int = -1, peers: int = 0) -> tuple[Any, ...]:
        """(params, version, seconds waited, departure, epoch, peers' departures) of partition
        `part`, once its version reaches `min_version`; `peers`: how many emulated peers the
        worker plays (positions worker + 1 ..., testbed.emulation.peers), each sent its copy too."""
        t0 = time.time()
        st = self.parts[part]
        params, version, waited = st.pull(min_version, timeout, epoch)
        if waited > 0.0005:
            self._span("wait", t0, t0 + waited)
        departure = self._send(part, worker)
        copies = [self._send(part, worker + 1 + j) for j in range(peers)]
        if departure is not None:
            sleep_until(departure)
        return params, version, waited, departure, st.epoch, copies

    def push(self, part: int, grad: np.ndarray, version_read: int, worker: int, iteration: int,
             loss: float, departure: float | None, epoch: int = 0, pull: float | None = None,
             peers: Sequence[float] = ()) -> dict[str, Any]:
        """Receive (through the NIC), decompress, apply or hold; with `pull` (a timeout), wait for
        the partition's next version and carry it back as ack["pull"] (see `pull`). The ack
        carries this server's spans so far, so a run that dies keeps the servers' timeline too.
        `peers`: the departures of the same push from the worker's emulated peers (positions
        worker + 1 ..., testbed.emulation.peers): the ingress queues each, in departure order."""
        t0 = time.time()
        st = self.parts[part]
        nbytes = int(grad.nbytes * self.factor)
        copies: list[tuple[float, int]] = []
        if worker == self.local_worker:
            delivered = t0
        else:
            delivered, due = self.endpoint.deliveries(nbytes, departure, peers)
            copies = [(t, worker + 1 + j) for j, t in enumerate(due)]
            sleep_until(max([delivered, *due]))
        t1 = time.time()
        self._span("recv", t0, t1)
        if part in self.decompressors:
            grad = self.decompressors[part].decompress(grad)
        if self.faults.due(st.version) == "kill":
            os._exit(1)  # injected server death, about to apply this version
        ack = st.push(grad, version_read, worker, iteration, loss, epoch, delivered, copies)
        if "update" in ack:
            self._span("apply", t1, time.time())
            if self.every and ack["update"]["version"] % self.every == 0:
                st.save(self._path(part, ack["update"]["version"]))
        order = ack.pop("contributors", None)
        if order is not None and pull is not None:
            with self.reply_cv:  # the completing push sends every contributor its reply
                version = ack["update"]["version"]
                for w in order:
                    self.replies[(part, version, w)] = self._send(part, w)
                self.reply_cv.notify_all()
        if pull is not None and ack["status"] != "stale-epoch":
            counted = self.sync and ack["status"] in ("applied", "nan")
            # sync: the version this push helps make; a duplicate of a push that counted: the
            # version that one helps make (it needs the others' gradients, never this worker's
            # next: this worker's iteration is done); otherwise whatever is newest now
            first = ack.get("version_read") if self.sync else None
            wait_for = version_read + 1 if counted else 0 if first is None else first + 1
            ack["pull"] = self._pull_back(part, version_read, worker, epoch, pull, counted, wait_for, len(peers))
        ack["events"] = self.drain_events()
        return ack

    def _pull_back(self, part: int, version_read: int, worker: int, epoch: int, timeout: float,
                   counted: bool, wait_for: int, peers: int = 0) -> tuple[Any, ...]:
        """The reply of a push-pull: version `wait_for` or newer; its departure was reserved by the
        push that completed the version when this gradient counted towards it, else here. (A
        duplicate -- an iteration redone by a worker that died after its push landed -- must not
        wait for version_read + 1: that version needs this worker's *next* gradient, which it
        cannot send before this reply: a deadlock.)"""
        t0 = time.time()
        st = self.parts[part]
        params, version, waited = st.pull(wait_for, timeout, epoch)
        if waited > 0.0005:
            self._span("wait", t0, t0 + waited)
        key = (part, version_read + 1, worker)
        if not counted or version != version_read + 1 or st.epoch != epoch:
            departure = self._send(part, worker)
            copies = [self._send(part, worker + 1 + j) for j in range(peers)]
        else:
            with self.reply_cv:
                if not self.reply_cv.wait_for(lambda: key in self.replies or st.epoch != epoch, timeout):
                    raise TimeoutError(f"parameter server {self.rank}: the reply of partition {part} "
                                       f"version {version_read + 1} was never scheduled")
                departure = self.replies.pop(key, None)  # its peers' were reserved in the same loop
                copies = [self.replies.pop((part, version_read + 1, worker + 1 + j), None) for j in range(peers)]
        if departure is not None:
            sleep_until(departure)  # on the wire no earlier than it leaves: receivers see departure order
        return params, version, waited, departure, st.epoch, copies

    def version(self) -> int:
        return min((st.version for st in self.parts.values()), default=0)

    def get_params(self) -> dict[int, np.ndarray]:
        out = {}
        for p, st in self.parts.items():
            with st.cv:
                out[p] = st.params.copy()
        return out

    def set_params(self, params: dict[int, np.ndarray]) -> None:
        """The initial parameters of this server's partitions (before any worker connects)."""
        for p, values in params.items():
            st = self.parts[p]
            with st.cv:
                np.copyto(st.params, values)
                if st.snapshot_every:
                    st.snapshots[0] = st.params.copy()

    def updates_since(self, version: int, part: int) -> list[dict[str, Any]]:
        return self.parts[part].updates_since(version)

    def snapshot(self, version: int, timeout: float) -> dict[int, np.ndarray]:
        """Every partition's parameters right after its `version` (see ShardState.snapshot)."""
        return {p: st.snapshot(version, timeout) for p, st in self.parts.items()}

    def ping(self) -> int:
        return os.getpid()

    def stats(self) -> dict[str, Any]:
        states = list(self.parts.values())
        return {"busy_s": sum(st.busy_s for st in states), "bytes_in": self.endpoint.bytes_in,
                "late_s": self.endpoint.late_s,
                "bytes_out": self.endpoint.bytes_out, "version": self.version(),
                "wall_s": time.time() - self.t_created}
