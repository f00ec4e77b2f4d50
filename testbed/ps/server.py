"""The parameter server's Ray shell: a server's partitions (`shard.ShardState` each, the pure
logic: versions, averaging, staleness, apply-once, checkpoints) behind its NIC.

    worker r                          server s (holds partitions p with p mod S = s)
      |   compute gradient g_r on the params it holds
      |-- push(p, g_r[p], v_read, r, i, pull) -->|  sync:  collect for v_read; at N-b: average,
      |                                          |         apply, and send every contributor its
      |<----- ack + (params_p, v_read + 1) ------|         reply, in delivery order
      |                                          |  async: apply now (staleness = version - v_read),
      |                                          |         reply with the newest version
      |-- pull(p, min_version) ------------------>|  (first iteration, after a rollback, under SSP)
      |<-------------------- (params_p, version) -|  blocks until version >= min_version

Cost per synchronous step: a server receives N*K*(its share) and sends as many bytes, all
through its one NIC -- the reason a single PS stops scaling (testbed.analysis.psmodel).

Emulated peers (ps-sync, `--real-workers K < N`, testbed.emulation.peers): a real worker's push
carries the departures of its peers' copies; the server queues each on its ingress
(`Endpoint.deliveries`), counts the push once per position it stands for, and sends every position
its reply. A version's mean sums N gradients in position order, the owner's once for each of its
positions, so the run equals one process stepping the owner-weighted mean
(testbed.workloads.reference). ps-async's peers have timelines of their own, played by the driver
(testbed.ps.async_peers): a server keeps every real worker's newest gradient of each partition,
and a thread of its own (testbed.ps.peer_play) plays the peers' copies and the real pushes in
order of emulated time; `peer_notices` hands the driver what it did with the copies.
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
from testbed.emulation.faults import FaultPlan
from testbed.emulation.network import sleep_until
from testbed.ps.async_peers import Entry, Notice
from testbed.ps.peer_play import PeerPlay
from testbed.ps.shard import ShardState
from testbed.runtime.worker import restarted
from testbed.training.compressor import Compressor


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
                 nic: str | None = None, local_worker: int | None = None, *, rank: int,
                 keep_latest: bool = False, **state: Any) -> None:
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
        # ps-async's emulated peers (testbed.ps.async_peers): every message through the NIC is
        # played by one thread in order of emulated time (testbed.ps.peer_play)
        self.play = PeerPlay(self.endpoint, rank, self._apply_copy, self._apply_real) if keep_latest else None
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

    def _send_with_peers(self, part: int, worker: int, peers: int) -> tuple[float | None, list[float | None]]:
        """`_send` to `worker` and to each of its `peers` emulated peers (the positions after it)."""
        return self._send(part, worker), [self._send(part, worker + 1 + j) for j in range(peers)]

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
        departure, copies = self._send_with_peers(part, worker, peers)
        if departure is not None:
            sleep_until(departure)
        return params, version, waited, departure, st.epoch, copies

    def push(self, part: int, grad: np.ndarray, version_read: int, worker: int, iteration: int,
             loss: float, departure: float | None, epoch: int = 0, pull: float | None = None,
             peers: Sequence[float] = (), samples: int = 0) -> dict[str, Any]:
        """Receive (through the NIC), decompress, apply or hold; with `pull` (a timeout), wait for
        the partition's next version and carry it back as ack["pull"] (see `pull`). The ack
        carries this server's spans so far, so a run that dies keeps the servers' timeline too.
        `peers`: the departures of the same push from the worker's emulated peers (positions
        worker + 1 ..., testbed.emulation.peers): the ingress queues each, in departure order."""
        t0 = time.time()
        st = self.parts[part]
        nbytes = int(grad.nbytes * self.factor)
        copies: list[tuple[float, int]] = []
        if self.play is not None:  # on receipt: ps-async's peers apply it as theirs (async_peers)
            self.play.keep(part, worker, grad, loss, samples)
            if departure is not None and worker != self.local_worker:
                return self._push_beside_peers(part, grad, nbytes, version_read, worker, iteration, loss,
                                               departure, epoch, pull, t0)
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
            self._checkpoint(part, ack)
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
            departure, copies = self._send_with_peers(part, worker, peers)
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

    def _checkpoint(self, part: int, ack: dict[str, Any]) -> None:
        """After every --checkpoint-every k-th version of `part` that `ack` says was made."""
        if "update" in ack and self.every and ack["update"]["version"] % self.every == 0:
            self.parts[part].save(self._path(part, ack["update"]["version"]))

    # ---- ps-async's emulated peers (testbed.ps.async_peers, played by testbed.ps.peer_play)
    def peer_push(self, entries: list[Entry], timeout: float) -> None:
        """Copies of emulated peers to play, each from its departure. `timeout`: how long a copy
        may wait for its owner's first gradient to reach this process."""
        assert self.play is not None
        self.play.copies([(self.logical[e[0]], e) for e in entries], timeout)

    def peer_notices(self, timeout: float, gather: float) -> list[Notice]:
        """What was done with the copies since the last call (`PeerPlay.notices`)."""
        assert self.play is not None
        return self.play.notices(timeout, gather)

    def _push_beside_peers(self, part: int, grad: np.ndarray, nbytes: int, version_read: int, worker: int,
                           iteration: int, loss: float, departure: float, epoch: int, pull: float | None,
                           t0: float) -> dict[str, Any]:
        """A real worker's push where emulated peers push too: played with their copies, in order
        of emulated time (testbed.ps.peer_play says why), applied at its delivery by
        `_apply_real`, its reply queued on the egress there."""
        assert self.play is not None
        if self.faults.due(self.parts[part].version) == "kill":
            os._exit(1)  # injected server death, about to apply this version
        slot = self.play.real(nbytes, departure, t0,
                              (part, grad, version_read, worker, iteration, loss, epoch, pull is not None))
        self._span("recv", t0, slot["delivered"])
        ack = slot["ack"]
        if "update" in ack:
            self._span("apply", slot["delivered"], slot["applied"])
        if "reply" in slot:
            params, version, reply = slot["reply"]
            sleep_until(reply)  # on the wire no earlier than it leaves
            ack["pull"] = (params, version, 0.0, reply, self.parts[part].epoch, [])
        ack["events"] = self.drain_events()
        return ack

    def _apply_real(self, slot: dict[str, Any], delivered: float) -> None:
        """A real worker's push, at its delivery (`_push_beside_peers`): apply it and, where it
        asks for one, queue its reply with the newest parameters."""
        assert self.play is not None
        part, grad, version_read, worker, iteration, loss, epoch, reply = slot["push"]
        st = self.parts[part]
        ack = st.push(grad, version_read, worker, iteration, loss, epoch, delivered)
        slot["applied"] = time.time()
        self._checkpoint(part, ack)
        if reply and ack["status"] != "stale-epoch":
            params, version, _ = st.pull(0, self.play.timeout, epoch)
            slot["reply"] = (params, version, self.endpoint.send(self.logical[part], at=delivered))
        slot["ack"], slot["delivered"] = ack, delivered

    def _apply_copy(self, e: Entry, delivered: float) -> Notice:
        """Apply peer e's copy: its owner's newest gradient of the partition, as the peer's push."""
        assert self.play is not None
        part, x, q, c, _, read = e
        grad, loss, samples = self.play.newest(q, part)
        st = self.parts[part]
        ack = st.push(grad, read, x, c, loss, st.epoch, delivered)
        self._checkpoint(part, ack)
        # the reply is queued at the copy's delivery, its emulated time, however late the thread
        # got to it (that lateness is counted, `PeerPlay.late_s`, and moves no emulated time)
        departure = self.endpoint.send(self.logical[part], at=delivered)
        return Notice(part, x, c, ack["status"], ack.get("version_applied"), ack.get("staleness"), st.version,
                      departure if departure is not None else delivered, loss, samples,
                      ack.get("update") if part == 0 else None)

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
                "late_s": self.endpoint.late_s + (self.play.late_s if self.play is not None else 0.0),
                "bytes_out": self.endpoint.bytes_out, "version": self.version(),
                "wall_s": time.time() - self.t_created}
