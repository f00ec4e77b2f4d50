"""The parameter-server driver loop shared by `ps-sync` and `ps-async`.

The driver keeps at most one iteration in flight per worker and never touches parameters or
gradients: it decides *when* a worker may start its next iteration.
- ps-sync: at once; the worker's pull blocks at the shard until the version it contributed to
  has been applied (the barrier lives in the server).
- ps-async: at once; the pull returns the latest version.
- ps-async with `--staleness-bound s` (SSP): iteration c of any worker may start only when every
  worker has finished iteration c-s-1 (`ssp_may_start`); the time held back is recorded as wait.

Parameters are split across S shards balanced by bytes (a tensor may be split): shard s owns the
flat range chunk_bounds(numel, S)[s]. Records of shard 0 stand for the model update sequence
(all shards see the same pushes); staleness is the largest over a worker's shards.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import numpy as np
import ray

from testbed import remote
from testbed.allreduce.ring import chunk_bounds
from testbed.ps.server import ShardActor
from testbed.ps.ssp import ssp_may_start
from testbed.ps.worker import PSWorker
from testbed.strategy import Recorder, StepRecord, Strategy, UpdateRecord
from testbed.workloads.base import unflatten

RemotePSWorker = ray.remote(PSWorker)
RemoteShard = ray.remote(ShardActor)


class ParameterServer(Strategy):
    family = "ps"
    sync: ClassVar[bool] = True

    def setup(self) -> None:
        cfg, t = self.config, self.config.cluster.timeout_s
        n, s = cfg.workers, cfg.ps.shards
        self.workers = remote.spawn(RemotePSWorker, self.cluster, n, cfg, device="cpu")
        remote.get([w.ping.remote() for w in self.workers], t, "worker start-up")
        params = remote.get(self.workers[0].get_params.remote(), t, "initial parameters")
        self.layout = remote.get(self.workers[0].layout.remote(), t, "layout")
        self.grad_bytes = remote.get(self.workers[0].logical_bytes.remote(), t, "sizes")
        factor = self.grad_bytes / (params.size * 4)
        self.bounds = chunk_bounds(params.size, s)
        self.shards = [
            RemoteShard.options(max_concurrency=2 * n + 4, **self.cluster.options(i, server=True)).remote(
                params[lo:hi], cfg.network, i, factor, lr=cfg.workload.lr, sync=self.sync, workers=n,
                backup=cfg.ps.backup_workers, max_updates=cfg.steps)
            for i, (lo, hi) in enumerate(self.bounds)
        ]
        remote.get([w.connect.remote(self.shards, self.bounds) for w in self.workers], t, "PS wiring")

    def run(self, recorder: Recorder) -> None:
        cfg, n = self.config, self.config.workers
        bound = cfg.ps.staleness_bound
        completed, next_iter = [0] * n, [0] * n
        min_version = [0] * n
        held_since: dict[int, float] = {}
        held_s = [0.0] * n
        inflight: dict[Any, int] = {}
        updates = 0
        self.t_run = time.time()
        self._pending_updates: dict[int, dict[str, Any]] = {}
        self._next_version = 1
        while True:
            if updates < cfg.steps:
                for w in range(n):
                    if w in inflight.values() or min_version[w] >= cfg.steps:
                        continue  # busy, or (sync) its next pull would wait for a version never made
                    if ssp_may_start(next_iter[w], completed, bound):
                        if w in held_since:
                            held_s[w] = time.time() - held_since.pop(w)
                        ref = self.workers[w].iteration.remote(next_iter[w], min_version[w])
                        inflight[ref] = w
                    else:
                        held_since.setdefault(w, time.time())
            if not inflight:
                break
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=cfg.cluster.timeout_s)
            if not ready:
                raise remote.RemoteTimeout(f"{self.name}: no worker finished an iteration within "
                                           f"{cfg.cluster.timeout_s:g}s (workers {sorted(inflight.values())})")
            w = inflight.pop(ready[0])
            info = remote.get(ready[0], cfg.cluster.timeout_s, f"worker {w} iteration")
            updates += self._record(recorder, w, next_iter[w], info, held_s[w])
            held_s[w] = 0.0
            completed[w] += 1
            next_iter[w] += 1
            if self.sync:
                min_version[w] = info["versions"][0] + 1
        recorder.events_from([e for h in self.workers
                              for e in remote.get(h.drain_events.remote(), cfg.cluster.timeout_s, "events")])

    def _record(self, recorder: Recorder, w: int, iteration: int, info: dict[str, Any], held: float) -> int:
        acks = info["acks"]
        applied = all(a["status"] == "applied" for a in acks)
        staleness = max(a["staleness"] for a in acks) if applied else -1
        recorder.step(StepRecord(
            run_id=self.run_id, strategy=self.name, worker=w, iteration=iteration,
            version_read=info["versions"][0],
            version_applied=acks[0]["version_applied"] if applied else -1,
            t_start=info["t_start"], compute_s=info["compute_s"], comm_s=info["comm_s"],
            wait_s=info["server_wait_s"] + held, bytes_sent=info["bytes_sent"],
            bytes_recv=info["bytes_recv"], samples=info["samples"], loss=info["loss"],
            staleness=staleness, injected_delay_s=info["injected_delay_s"]))
        update = acks[0].get("update")
        if update is None:
            return 0
        # acks reach the driver in completion order; updates are recorded in version order
        self._pending_updates[update["version"]] = update
        while self._next_version in self._pending_updates:
            recorder.update(UpdateRecord(**self._pending_updates.pop(self._next_version)))
            self._next_version += 1
        return 1

    def summary_extra(self) -> dict[str, Any]:
        stats = remote.get([s.stats.remote() for s in self.shards], self.config.cluster.timeout_s, "server stats")
        steps = max(1, stats[0]["version"])
        wall = max(1e-9, time.time() - self.t_run)
        return {
            "grad_bytes_logical": self.grad_bytes, "ps_shards": len(self.shards),
            "server_busy_frac": [s["busy_s"] / wall for s in stats],
            "server_ingress_bytes_per_step": [s["bytes_in"] / steps for s in stats],
            "server_egress_bytes_per_step": [s["bytes_out"] / steps for s in stats],
        }

    def parameters(self) -> dict[str, np.ndarray]:
        parts = remote.get([s.get_params.remote() for s in self.shards], self.config.cluster.timeout_s, "params")
        return unflatten(np.concatenate(parts), self.layout)

    def teardown(self) -> None:
        remote.kill_all(getattr(self, "workers", []))
        remote.kill_all(getattr(self, "shards", []))
