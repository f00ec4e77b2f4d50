"""The parameter-server driver loop of `ps-sync` and `ps-async` (spec.py says what each is).

The driver keeps at most one iteration in flight per worker and never touches parameters or
gradients: it decides *when* a worker may start its next iteration.
- ps-sync: at once; the worker's pull blocks at the shard until the version it contributed to
  has been applied (the barrier lives in the server).
- ps-async: at once; the pull returns the latest version.
- ps-async with `--staleness-bound s` (SSP): iteration c of any worker may start only when every
  worker has finished iteration c-s-1 (`ssp_may_start`); the time held back is recorded as wait.

Parameters are cut into partitions dealt round-robin to S servers (`testbed.ps.partition`), each
versioned on its own. Records of partition 0 stand for the model update sequence (every partition
sees the same pushes); staleness is the largest over a worker's partitions. With
`--ps-placement colocated` server i sits in worker i's placement bundle and shares its NIC.
ps-async's emulated peers (`--real-workers K < N`) are the driver's to play: it waits on the
servers' notices beside its workers' iterations and applies its rule to a peer's iteration when
its end comes (testbed.ps.player, testbed.ps.async_peers).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import ray

from testbed.analysis.records import Recorder, UpdateRecord
from testbed.config import ConfigError
from testbed.emulation.faults import NonFiniteGradient, RestartsExhausted, ServerLost
from testbed.ps.async_peers import Done
from testbed.ps.partition import partition
from testbed.ps.player import PeerPlayer
from testbed.ps.schedule import Schedule
from testbed.ps.server import ShardActor
from testbed.ps.shard import push_staleness
from testbed.ps.worker import PSWorker, nic_file, remove_nic_files
from testbed.runtime import remote
from testbed.strategies.contract import Strategy
from testbed.training.optim import optimizer_for
from testbed.workloads.base import unflatten

# the workers' common start of their first iterations: this long after the driver reaches it, and
# as much again per real worker (its calls to reach them all)
START_S, START_PER_WORKER_S = 0.05, 0.005


class ParameterServer(Strategy):
    def setup(self) -> None:
        cfg, t = self.config, self.config.cluster.timeout_s
        n, s = cfg.workers, cfg.ps.count
        # the real workers only, where the others are emulated peers (--real-workers, testbed.emulation.peers)
        self.workers = remote.spawn(PSWorker, self.cluster, cfg.real_workers, cfg, device=self.cluster.device,
                                    max_restarts=cfg.faults.max_restarts, concurrency=2)
        self.worker_live = remote.Liveness(self.workers, t, "worker")
        params = remote.get(self.workers[0].get_params.remote(), t, "initial parameters")
        self.layout = remote.get(self.workers[0].layout.remote(), t, "layout")
        self.grad_bytes = remote.get(self.workers[0].logical_bytes.remote(), t, "sizes")
        factor = self.grad_bytes / (params.size * 4)
        self.sync = self.spec.sync
        self.parts = partition(params.size, self.grad_bytes, cfg.ps.partition_mb, s)
        self.eval_every = cfg.eval.interval(cfg.steps)  # servers keep those versions for evaluation
        self.colocated = self.spec.colocated_servers(cfg)
        # ps-async's emulated peers have timelines of their own, which the driver plays
        # (testbed.ps.async_peers); ps-sync's ride their owners' pushes (testbed.emulation.peers)
        self.plays_peers = not self.sync and cfg.real_workers < n
        # a colocated server shares its worker's NIC: a small file on their machine (emulation),
        # this strategy's own (two runs of one id at once, as a test suite's two processes run
        # them, would otherwise share a NIC, and the first to end would remove the other's)
        self.nic_tag = f"{self.run_id}-{uuid.uuid4().hex[:8]}"
        self.nics = ([nic_file(self.nic_tag, i) if cfg.network.emulated else None for i in range(s)]
                     if self.colocated else [None] * s)
        if any(self.nics):
            remote.get([self.workers[i].make_nic.remote(path) for i, path in enumerate(self.nics)], t, "shared NICs")
        ckpt = str(Path(self.workdir) / "checkpoints") if self.workdir else None
        if ckpt and cfg.faults.checkpoint_every:
            Path(ckpt).mkdir(parents=True, exist_ok=True)
        threads = [self.spec.server_threads(cfg, len(self.parts.on_server(i)), s) for i in range(s)]
        why = self.spec.threads_refused(cfg, threads, self.cluster.nodes_at_start)
        if why:  # known only once the workers tell the gradient's size, so after Ray started
            raise ConfigError(why)
        self.shards = [
            remote.spawn_server(
                ShardActor, self.cluster, i, cfg,
                {p: self.parts.bounds[p][1] - self.parts.bounds[p][0] for p in self.parts.on_server(i)},
                cfg.network, factor, concurrency=threads[i],
                max_restarts=cfg.faults.max_restarts, checkpoint_dir=ckpt,
                checkpoint_every=cfg.faults.checkpoint_every, faults=cfg.faults.fail.items,
                compression=cfg.compression, nic=self.nics[i], local_worker=i if self.colocated else None,
                optimizer=optimizer_for(cfg.workload), snapshot_every=self.eval_every, sync=self.sync, workers=n, backup=cfg.ps.backup_workers,
                max_updates=cfg.steps, on_nan=cfg.faults.on_nan, keep_latest=self.plays_peers)
            for i in range(s)
        ]
        # parameters by a call, not in the constructor: a restarted server loads its checkpoint.
        # The servers' first call: it waits for their processes to start (a restart's allowance)
        remote.get([sh.set_params.remote({p: params[slice(*self.parts.bounds[p])] for p in self.parts.on_server(i)})
                    for i, sh in enumerate(self.shards)], remote.startup_timeout(t), "PS parameters")
        self.shard_live = remote.Liveness(self.shards, t, "PS server")
        # ps-async: the workers start on version 0, handed to them here, not pulled by all N in the
        # first iteration (an incast whose order would be this machine's timing, and ps-async's
        # measure, the iterations' mean, counts it); ps-sync's first step still pulls
        self._wire(range(cfg.real_workers), None if self.sync else ray.put(params))
        self.player = PeerPlayer(cfg, self.shards, self.parts, factor) if self.plays_peers else None

    def _wire(self, ranks: Any, initial: Any = None) -> None:
        """Connect workers to the servers; at the start, `initial` hands them the servers' version 0
        (a restarted worker pulls what is current instead)."""
        t = self.config.cluster.timeout_s
        remote.get([self.workers[r].connect.remote(self.shards, self.parts, self.colocated, initial,
                                                   driver_plays_peers=self.plays_peers) for r in ranks],
                   t, "PS wiring")

    def run(self, recorder: Recorder) -> None:
        cfg = self.config
        self.sched = Schedule(cfg.real_workers, cfg.steps, sync=self.sync, bound=cfg.ps.staleness_bound)
        # under SSP a worker pulls once the driver lets its iteration start (worker.py)
        self.pull_after = cfg.ps.staleness_bound is None
        self.inflight: dict[Any, tuple[int, int, float]] = {}  # ref -> (worker, epoch, submitted)
        self.epoch = 0
        self.reviving: dict[Any, int] = {}  # ping ref -> worker being restarted
        self.revive_info: dict[int, tuple[float, str]] = {}
        self.t_run = time.time()
        self._pending_updates: dict[int, dict[str, Any]] = {}
        self._next_version = 1
        self._stall_version, self._stalls = 1, 0  # recoveries in a row without progress (_recover)
        recorder.evaluate(0, self._snapshot(0))
        # every worker begins its first iteration at one instant, as the cluster (and the cost
        # model) does, not as this driver's calls happen to reach them (their spread would be
        # cluster time too); a call that comes later counts its delay as lateness
        start_at: float | None = time.time() + START_S + START_PER_WORKER_S * cfg.real_workers
        player = self.player
        if player is not None:
            player.start_all(start_at)  # every emulated peer's first iteration, at the common start
        while True:
            recorded = self._next_version - 1 + len(self._pending_updates)
            if recorded < cfg.steps:
                busy = {v[0] for v in self.inflight.values()} | set(self.reviving.values())
                # asynchronous: every worker's first iteration, then only while the iterations in
                # flight may still be among the --steps updates (one begun beyond them would only be
                # refused, and whether it begins would hang on which iterations end first)
                room = cfg.steps - recorded - len(self.inflight) - (player.running if player else 0)
                for w in self.sched.startable(busy):
                    if not self.sync and self.sched.next_iter[w] > 0:
                        if room <= 0:
                            continue
                        room -= 1
                    ref = self.workers[w].iteration.remote(self.sched.next_iter[w], self.sched.min_version[w],
                                                           self.epoch, pull_after=self.pull_after, start_at=start_at)
                    self.inflight[ref] = (w, self.epoch, time.time())
                if player is not None:
                    player.start_held(room, time.time())
                start_at = None
            if not self.inflight and not self.reviving and not (player and player.running):
                break
            ready = self._wait(player, remote.startup_timeout(cfg.cluster.timeout_s) if not self.inflight
                               else cfg.cluster.timeout_s)
            if player is not None:
                for done in player.ended():
                    self._record_peer(recorder, done)
            if ready is None:
                continue  # an emulated peer's iteration ended
            if not ready:
                self._recover(recorder, "RemoteTimeout")
                continue
            if player is not None and ready[0] in player.polls:
                if not player.take(ready[0]):  # no copy applied within --timeout
                    self._recover(recorder, "RemoteTimeout")
                continue
            if ready[0] in self.reviving:
                self._revived(recorder, ready[0])
                continue
            w, epoch, t_submit = self.inflight.pop(ready[0])
            try:
                info = ray.get(ready[0], timeout=cfg.cluster.timeout_s)
            except (*remote.ACTOR_ERRORS, ray.exceptions.RayTaskError) as exc:
                self._fail_or_recover(recorder, exc, w, t_submit)
                continue
            if info.get("reset") or epoch != self.epoch:
                continue  # begun before a rollback: void, the worker starts again
            held = self.sched.finished(w, info["versions"][0])
            self._record(recorder, w, self.sched.next_iter[w] - 1, info, held)
        if player is not None:
            player.finish()
        recorder.events_from(remote.drain_events([*self.workers, *self.shards], cfg.cluster.timeout_s))

    def _wait(self, player: PeerPlayer | None, timeout: float) -> list[Any] | None:
        """The next of the workers' iterations, restarts and (with emulated peers) the servers'
        notices to answer, within `timeout`: [] if none did; None where an emulated peer's
        iteration ends first (the driver then applies its rule to it)."""
        refs = [*self.inflight, *self.reviving, *(player.polls if player else ())]
        due = player.next_due() if player else None
        if due is not None and due - time.time() < timeout:
            timeout = max(0.0, due - time.time())
            if not refs:
                time.sleep(timeout)
                return None
            ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
            return ready or None
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        return ready

    def _record_peer(self, recorder: Recorder, d: Done) -> None:
        """An emulated peer's iteration (testbed.ps.async_peers): a step row of its own, and the
        update its push of partition 0 made, counted as a real worker's is, when it ends."""
        self.record(recorder, d.position, d.iteration, d.report(), version_read=d.version_read,
                    version_applied=d.version_applied, wait_s=0.0)
        if d.update is not None and d.update["version"] >= self._next_version:
            self._pending_updates[d.update["version"]] = d.update
            self._emit_updates(recorder)

    def _fail_or_recover(self, recorder: Recorder, exc: BaseException, w: int, t_submit: float) -> None:
        """Recover from deaths and hangs (of a worker, or of a shard it was talking to); any
        other error in a worker is a bug or a --on-nan stop, and ends the run."""
        # (a RayTaskError raised by a call *inside* the worker also subclasses its cause's type)
        if isinstance(exc, ray.exceptions.RayActorError) and not isinstance(exc, ray.exceptions.RayTaskError):
            self._revive_worker(w, t_submit, type(exc).__name__)  # lost from the failed call on
            self._fill_updates(recorder)
            return
        cause = remote.root_cause(exc)
        if isinstance(cause, NonFiniteGradient):
            raise NonFiniteGradient(str(cause).splitlines()[0]) from None
        if not isinstance(cause, (*remote.ACTOR_ERRORS, ray.exceptions.GetTimeoutError, TimeoutError)):
            raise exc
        self._recover(recorder, type(cause).__name__)

    def _recover(self, recorder: Recorder, cause: str) -> None:
        """Something hangs or a shard died: revive shards (rolling all back), then workers.

        A recovery that finds nobody to revive and is followed by no model update is a stall;
        past max(1, --max-restarts) stalls in a row the run stops with the reason (a wait that
        nothing can end must not be retried forever)."""
        t0 = time.time()
        revived = self.shard_live.revive()
        if revived:
            self._rollback(recorder, revived, cause, t0)
        dead = self.worker_live.find_dead()
        for r in dead:
            self._revive_worker(r, t0, cause)
        before = self._next_version
        self._fill_updates(recorder)
        if revived or dead or self._next_version > before or self._next_version != self._stall_version:
            self._stall_version, self._stalls = self._next_version, 0
            return
        self._stalls += 1
        if self._stalls > max(1, self.config.faults.max_restarts):
            raise RestartsExhausted(
                f"{self.config.strategy}: no model update after version {self._next_version - 1} in "
                f"{self._stalls} --timeout windows ({self.config.cluster.timeout_s:g} s each, last cause "
                f"{cause}) and no actor to revive; the run stops")

    def _revive_worker(self, r: int, t0: float, cause: str) -> None:
        """Wait for worker r's restart in the main loop, so that the others go on meanwhile."""
        if r not in self.reviving.values():
            self.reviving[self.worker_live.ping(r)] = r
            self.revive_info[r] = (t0, cause)

    def _fill_updates(self, recorder: Recorder) -> None:
        """A worker that died after its push took the update's ack with it: read the shard's log."""
        first = self.shards[self.parts.server_of[0]]  # partition 0's versions stand for the model's
        for u in remote.get(first.updates_since.remote(self._next_version - 1, 0),
                            self.config.cluster.timeout_s, "update log"):
            self._pending_updates.setdefault(u["version"], u)
        self._emit_updates(recorder)

    def _revived(self, recorder: Recorder, ref: Any) -> None:
        """A restarted worker answered: re-wire it to the shards; it is idle again."""
        r = self.reviving.pop(ref)
        t = self.config.cluster.timeout_s
        if not self.worker_live.answered(r, ref, timeout=t):
            self.reviving[self.worker_live.ping(r)] = r  # still restarting
            return
        if r < len(self.nics) and self.nics[r]:
            remote.get(self.workers[r].make_nic.remote(self.nics[r]), t, "shared NIC")
        self._wire([r])
        t0, cause = self.revive_info.pop(r)
        recorder.fault("worker-restart", f"worker{self.positions[r]}", self.sched.next_iter[r], t0, time.time(), cause=cause)

    def _rollback(self, recorder: Recorder, revived: list[int], cause: str, t0: float) -> None:
        t = self.config.cluster.timeout_s
        health = remote.get([self.shards[i].health.remote() for i in revived], t, "shard health")
        if any(h["lost"] for h in health):
            raise ServerLost(f"PS shard {revived[0]} died and has no checkpoint to resume from; "
                             "use --checkpoint-every K to survive shard deaths")
        held = remote.get([s.checkpoint_versions.remote() for s in self.shards], t, "checkpoints")
        common = set(held[0]).intersection(*map(set, held[1:]))
        if not common:
            raise ServerLost("PS shards hold no common checkpoint version; the run stops")
        version = max(common)
        self.epoch += 1
        remote.get([s.restore.remote(version, self.epoch) for s in self.shards], t, "shard rollback")
        redone = self._next_version - 1 + len(self._pending_updates) - version
        recorder.rollback(version)
        self._pending_updates = {}
        self._next_version = version + 1
        self.sched.rollback(version)
        for i in revived:
            recorder.fault("server-restart", f"ps{i}", version, t0, time.time(), cause=cause,
                           resumed_from_version=version, updates_redone=redone)

    def _record(self, recorder: Recorder, w: int, iteration: int, info: dict[str, Any], held: float) -> int:
        acks = info["acks"]
        if any(a["status"] == "nan" for a in acks):
            recorder.fault("nan-skipped", f"worker{self.positions[w]}", iteration, info["t_end"], info["t_end"])
        for a in acks:  # the shards' own spans travel with their acks
            recorder.events_from(a.pop("events", ()))
        # staleness is the largest over the worker's shards: version_applied - version_read
        read = info["versions"][0]
        stalest = push_staleness(acks)
        self.record(recorder, self.positions[w], iteration, info, version_read=read,
                    version_applied=None if stalest is None else read + stalest,
                    wait_s=info["server_wait_s"] + held)
        update = acks[0].get("update")
        if update is None or update["version"] < self._next_version:
            # (the shard's log, read after a worker died, may have recorded it already: kept in
            # the pending ones it would count twice and be emitted never)
            return 0
        # acks reach the driver in completion order; updates are recorded in version order
        self._pending_updates[update["version"]] = update
        self._emit_updates(recorder)
        return 1

    def _emit_updates(self, recorder: Recorder) -> None:
        while self._next_version in self._pending_updates:
            recorder.update(UpdateRecord(**self._pending_updates.pop(self._next_version)))
            recorder.evaluate(self._next_version, self._snapshot(self._next_version))
            self._next_version += 1

    def _snapshot(self, version: int) -> Any:
        """A fetch of the parameters the servers kept right after `version` (evaluation): it runs
        on the evaluator's thread, so the driver never waits for it."""
        def fetch() -> np.ndarray:
            t = self.config.cluster.timeout_s
            held = remote.get([s.snapshot.remote(version, t) for s in self.shards], t, f"version {version}")
            return np.concatenate([held[self.parts.server_of[p]][p] for p in range(self.parts.count)])
        return fetch

    def summary_extra(self) -> dict[str, Any]:
        t = self.config.cluster.timeout_s
        stats = remote.get([s.stats.remote() for s in self.shards], t, "server stats")
        nics = remote.get_each([w.nic_stats.remote() for w in self.workers], t, "worker NICs")
        steps = max(1, max(s["version"] for s in stats))
        wall = max(1e-9, time.time() - self.t_run)
        return {
            "grad_bytes_logical": self.grad_bytes, "ps_shards": len(self.shards),
            "ps_partitions": self.parts.count, "ps_placement": self.config.ps.placement,
            "ps_partition_bytes": max(hi - lo for lo, hi in self.parts.bounds) * self.grad_bytes
            / max(1, self.parts.bounds[-1][1]),
            "server_busy_frac": [s["busy_s"] / wall for s in stats],
            "server_ingress_bytes_per_step": [s["bytes_in"] / steps for s in stats],
            "server_egress_bytes_per_step": [s["bytes_out"] / steps for s in stats],
            "endpoint_late_s": sum(s["late_s"] for s in stats),
            **self._links(stats, nics, steps, wall),
            "workers_unreported": [self.positions[r] for r, w in enumerate(nics) if w is None],
        }

    def _links(self, stats: list[dict[str, Any]], nics: list[dict[str, Any]], steps: int,
               wall: float) -> dict[str, Any]:
        """Bytes through each NIC per model update, and how busy the busiest one was."""
        ingress, egress = {}, {}
        for r, w in enumerate(nics):
            if w is None:  # its actor is gone (a lost node): no figure rather than a made-up one
                continue
            name = f"worker{self.positions[r]}"
            ingress[name], egress[name] = w["bytes_in"] / steps, w["bytes_out"] / steps
        for i, s in enumerate(stats):
            name = f"worker{i}" if self.colocated else f"ps{i}"  # a colocated server's NIC is its worker's
            ingress[name] = ingress.get(name, 0.0) + s["bytes_in"] / steps
            egress[name] = egress.get(name, 0.0) + s["bytes_out"] / steps
        busiest = max(ingress, key=lambda k: max(ingress[k], egress[k]))
        net = self.config.network
        busy = (max(ingress[busiest], egress[busiest]) * steps / net.wire[0] / wall
                if net.wire is not None else None)
        return {"nic_ingress_bytes_per_step": ingress, "nic_egress_bytes_per_step": egress,
                "bottleneck_nic": busiest, "bottleneck_busy_frac": busy}

    def parameters(self) -> dict[str, np.ndarray]:
        held = remote.get_each([s.get_params.remote() for s in self.shards], self.config.cluster.timeout_s, "params")
        if None in held:
            raise ServerLost(f"PS shard {held.index(None)} is gone (its process or node was lost) and its "
                             "final parameters with it; the records are kept (--checkpoint-every K keeps "
                             "checkpoints on disk)")
        flat = np.concatenate([held[self.parts.server_of[p]][p] for p in range(self.parts.count)])
        return unflatten(flat, self.layout)

    def teardown(self) -> None:
        remote.kill_all(getattr(self, "workers", []))
        remote.kill_all(getattr(self, "shards", []))
        if getattr(self, "nic_tag", None):  # (set up far enough to have made any)
            remove_nic_files(self.nic_tag)
