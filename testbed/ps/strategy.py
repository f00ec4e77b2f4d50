"""The parameter-server driver loop of `ps-sync` and `ps-async` (spec.py says what each is).

The driver keeps at most one iteration in flight per worker and never touches parameters or
gradients: it decides *when* a worker may start its next iteration.
- ps-sync: at once; the worker's pull blocks at the shard until the version it contributed to
  has been applied (the barrier lives in the server).
- ps-async: at once; the pull returns the latest version.
- ps-async with `--staleness-bound s` (SSP): iteration c of any worker may start only when every
  worker has finished iteration c-s-1 (`ssp_may_start`); the time held back is recorded as wait.

Parameters are split across S shards balanced by bytes (a tensor may be split): shard s owns the
flat range shard_bounds(numel, S)[s]. Records of shard 0 stand for the model update sequence
(all shards see the same pushes); staleness is the largest over a worker's shards.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import ray

from testbed.emulation.faults import NonFiniteGradient, ServerLost
from testbed.ps.schedule import Schedule
from testbed.ps.server import ShardActor, shard_bounds
from testbed.ps.worker import PSWorker
from testbed.records import Recorder, UpdateRecord
from testbed.runtime import remote
from testbed.strategy import Strategy
from testbed.workloads.base import unflatten

RemotePSWorker = ray.remote(PSWorker)
RemoteShard = ray.remote(ShardActor)


class ParameterServer(Strategy):
    def setup(self) -> None:
        cfg, t = self.config, self.config.cluster.timeout_s
        n, s = cfg.workers, cfg.ps.shards
        self.workers = remote.spawn(RemotePSWorker, self.cluster, n, cfg, device="cpu",
                                    max_restarts=cfg.faults.max_restarts, concurrency=2)
        self.worker_live = remote.Liveness(self.workers, t, "worker")
        params = remote.get(self.workers[0].get_params.remote(), t, "initial parameters")
        self.layout = remote.get(self.workers[0].layout.remote(), t, "layout")
        self.grad_bytes = remote.get(self.workers[0].logical_bytes.remote(), t, "sizes")
        factor = self.grad_bytes / (params.size * 4)
        self.sync = self.spec.sync
        self.bounds = shard_bounds(params.size, s)
        ckpt = str(Path(self.workdir) / "checkpoints") if self.workdir else None
        if ckpt and cfg.faults.checkpoint_every:
            Path(ckpt).mkdir(parents=True, exist_ok=True)
        self.shards = [
            RemoteShard.options(max_concurrency=2 * n + 4, max_restarts=cfg.faults.max_restarts,
                                max_task_retries=0, **self.cluster.options(i, server=True)).remote(
                hi - lo, cfg.network, i, factor, checkpoint_dir=ckpt,
                checkpoint_every=cfg.faults.checkpoint_every, faults=cfg.faults.fail.items,
                compression=cfg.compression, lr=cfg.workload.lr,
                sync=self.sync, workers=n, backup=cfg.ps.backup_workers, max_updates=cfg.steps,
                on_nan=cfg.faults.on_nan)
            for i, (lo, hi) in enumerate(self.bounds)
        ]
        # parameters by a call, not in the constructor: a restarted shard loads its checkpoint
        remote.get([sh.set_params.remote(params[lo:hi]) for sh, (lo, hi) in zip(self.shards, self.bounds,
                                                                                  strict=True)], t, "PS parameters")
        self.shard_live = remote.Liveness(self.shards, t, "PS shard")
        remote.get([w.connect.remote(self.shards, self.bounds) for w in self.workers], t, "PS wiring")

    def run(self, recorder: Recorder) -> None:
        cfg = self.config
        self.sched = Schedule(cfg.workers, cfg.steps, sync=self.sync, bound=cfg.ps.staleness_bound)
        self.inflight: dict[Any, tuple[int, int, float]] = {}  # ref -> (worker, epoch, submitted)
        self.epoch = 0
        self.reviving: dict[Any, int] = {}  # ping ref -> worker being restarted
        self.revive_info: dict[int, tuple[float, str]] = {}
        self.t_run = time.time()
        self._pending_updates: dict[int, dict[str, Any]] = {}
        self._next_version = 1
        while True:
            if self._next_version - 1 + len(self._pending_updates) < cfg.steps:
                busy = {v[0] for v in self.inflight.values()} | set(self.reviving.values())
                for w in self.sched.startable(busy):
                    ref = self.workers[w].iteration.remote(self.sched.next_iter[w], self.sched.min_version[w],
                                                           self.epoch)
                    self.inflight[ref] = (w, self.epoch, time.time())
            if not self.inflight and not self.reviving:
                break
            ready, _ = ray.wait([*self.inflight, *self.reviving], num_returns=1,
                                timeout=remote.startup_timeout(cfg.cluster.timeout_s) if not self.inflight
                                else cfg.cluster.timeout_s)
            if not ready:
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
        recorder.events_from(remote.drain_events([*self.workers, *self.shards], cfg.cluster.timeout_s))

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
        """Something hangs or a shard died: revive shards (rolling all back), then workers."""
        t0 = time.time()
        revived = self.shard_live.revive()
        if revived:
            self._rollback(recorder, revived, cause, t0)
        for r in self.worker_live.find_dead():
            self._revive_worker(r, t0, cause)
        self._fill_updates(recorder)

    def _revive_worker(self, r: int, t0: float, cause: str) -> None:
        """Wait for worker r's restart in the main loop, so that the others go on meanwhile."""
        if r not in self.reviving.values():
            self.reviving[self.worker_live.ping(r)] = r
            self.revive_info[r] = (t0, cause)

    def _fill_updates(self, recorder: Recorder) -> None:
        """A worker that died after its push took the update's ack with it: read the shard's log."""
        for u in remote.get(self.shards[0].updates_since.remote(self._next_version - 1),
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
        remote.get(self.workers[r].connect.remote(self.shards, self.bounds), t, "PS re-wiring")
        t0, cause = self.revive_info.pop(r)
        recorder.fault("worker-restart", f"worker{r}", self.sched.next_iter[r], t0, time.time(), cause=cause)

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
        applied = all(a["status"] == "applied" for a in acks)
        if any(a["status"] == "nan" for a in acks):
            recorder.fault("nan-skipped", f"worker{w}", iteration, info["t_end"], info["t_end"])
        for a in acks:  # the shards' own spans travel with their acks
            recorder.events_from(a.pop("events", ()))
        # staleness is the largest over the worker's shards: version_applied - version_read
        read = info["versions"][0]
        stalest = max(a["staleness"] for a in acks) if applied else None
        self.record(recorder, w, iteration, info, version_read=read,
                    version_applied=None if stalest is None else read + stalest,
                    wait_s=info["server_wait_s"] + held)
        update = acks[0].get("update")
        if update is None:
            return 0
        # acks reach the driver in completion order; updates are recorded in version order
        self._pending_updates[update["version"]] = update
        self._emit_updates(recorder)
        return 1

    def _emit_updates(self, recorder: Recorder) -> None:
        while self._next_version in self._pending_updates:
            recorder.update(UpdateRecord(**self._pending_updates.pop(self._next_version)))
            self._next_version += 1

    def summary_extra(self) -> dict[str, Any]:
        stats = remote.get([s.stats.remote() for s in self.shards], self.config.cluster.timeout_s, "server stats")
        steps = max(1, stats[0]["version"])
        wall = max(1e-9, time.time() - self.t_run)
        return {
            "grad_bytes_logical": self.grad_bytes, "ps_shards": len(self.shards),
            "server_busy_frac": [s["busy_s"] / wall for s in stats],
            "server_ingress_bytes_per_step": [s["bytes_in"] / steps for s in stats],
            "server_egress_bytes_per_step": [s["bytes_out"] / steps for s in stats],
            "endpoint_late_s": sum(s["late_s"] for s in stats),
        }

    def parameters(self) -> dict[str, np.ndarray]:
        parts = remote.get([s.get_params.remote() for s in self.shards], self.config.cluster.timeout_s, "params")
        return unflatten(np.concatenate(parts), self.layout)

    def teardown(self) -> None:
        remote.kill_all(getattr(self, "workers", []))
        remote.kill_all(getattr(self, "shards", []))
