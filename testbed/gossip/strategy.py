"""Strategy `gossip`: decentralised parallel SGD, no server, no global sum, no global barrier.

Every worker keeps its own replica, takes a local SGD step on its shard and averages with its
graph neighbours (`--topology ring|torus|exponential|complete`; graphs, mixing matrix W and
cost in `topology.py`; the worker's two step kinds in `peer.py`)::

    synchronous (default)     x_i <- sum_j W_ij (x_j - lr g_j)   neighbours' step-t models only
    --gossip-async            local step, then x_i, x_j <- (x_i + x_j)/2 with a random neighbour

The driver keeps one call in flight per worker and starts a worker's next step as soon as its
previous one returns, so workers drift apart as far as the graph lets them. It never moves a
model between workers; it only watches: each step returns the worker's replica, from which the
driver derives the consensus distance (mean L2 distance of the replicas from their average)
and evaluates the *average* model -- the model gossip SGD is judged by -- on a separate thread.

Model updates (the `--steps` budget and the UpdateRecords):
- synchronous: one global step, complete once every worker has finished iteration t. Its loss
  is the average model's before the step (x_bar_t) on the step's global batch, as mapreduce
  reports the loss of the parameters a step starts from; its consensus distance is measured
  after the step's mixing. StepRecords: version_read = version_applied = t, staleness 0.
- asynchronous: one applied local gradient, numbered in the order the driver sees them (as
  for ps-async), about steps/N iterations per worker. Versions in StepRecords are the
  worker's replica versions; staleness = averagings that landed during the gradient. Loss and
  consensus distance use the replicas as each worker last reported them.

Cost: a + d K/B per synchronous step (d neighbours, d*K bytes sent per worker per step);
2(a + K/B) per asynchronous exchange. `parameters()` returns the average of the replicas.
Watching costs the driver one replica per worker step (K bytes each; not counted as gossip
traffic, and off the workers' critical path except for the copy a step returns).

Faults: there is no recovery. A dead or hung worker stalls its neighbours, whose receives (or
averaging calls) time out after --timeout; the run then fails with every record so far kept. A
worker whose process died is named: the run records a `worker-lost` fault and fails with one
line naming the worker and its iteration (`WorkerLost`).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import replace
from typing import Any

import numpy as np
import ray

from testbed.analysis.records import Recorder, UpdateRecord
from testbed.emulation.peers import weights
from testbed.gossip.peer import GossipPeer
from testbed.gossip.segment import most_senders
from testbed.gossip.topology import (
    consensus_distance,
    degree,
    mixing_matrix,
    neighbours,
    spectral_gap,
)
from testbed.runtime import remote
from testbed.strategies.contract import Strategy
from testbed.workloads import make_workload
from testbed.workloads.base import unflatten


class GossipSGD(Strategy):
    def setup(self) -> None:
        cfg, t = self.config, self.config.cluster.timeout_s
        self.degree = degree(cfg.gossip.topology, cfg.workers)
        # spare threads take the other real workers' messages (or averaging calls, asynchronous)
        callers = self.degree if cfg.gossip.asynchronous else most_senders(cfg.gossip.topology, cfg.workers,
                                                                           cfg.real_workers)
        self.peers = remote.spawn(GossipPeer, self.cluster, cfg.real_workers, cfg, device=self.cluster.device,
                                  concurrency=callers + 3)
        remote.get([p.ping.remote() for p in self.peers], remote.startup_timeout(t), "gossip worker start-up")
        params = remote.get(self.peers[0].get_params.remote(), t, "initial parameters")
        remote.broadcast(self.peers, params, t)
        remote.get([p.connect.remote(self.peers) for p in self.peers], t, "gossip wiring")
        self.layout = remote.get(self.peers[0].layout.remote(), t, "layout")
        self.grad_bytes = remote.get(self.peers[0].logical_bytes.remote(), t, "sizes")
        # The driver's own replica evaluates the average model (no compute time to sleep).
        self.model = make_workload(replace(cfg.workload, compute_ms=0.0), seed=cfg.seed, workers=cfg.workers)
        self.distances: list[float] = []
        self.ended: dict[int, float] = {}  # real worker -> when its last reported iteration ended

    def run(self, recorder: Recorder) -> None:
        cfg = self.config
        replicas = self.replica_parameters()
        self.initial_distance = consensus_distance(replicas)
        self.latest = dict(enumerate(replicas))
        recorder.evaluate(0, np.mean(replicas, axis=0).astype(np.float32))
        losses = _UpdateLoss(self.model, recorder)
        try:
            if cfg.gossip.asynchronous:
                self._run_async(recorder, losses)
            else:
                self._run_sync(recorder, losses, np.mean(replicas, axis=0))
        except WorkerLost as lost:
            recorder.fault("worker-lost", f"worker{lost.worker}", lost.iteration, lost.t_issue, time.time(),
                           cause=lost.error, recovery="none")
            raise
        finally:
            losses.close(cfg.cluster.timeout_s)
        recorder.events_from(remote.drain_events(self.peers, cfg.cluster.timeout_s))

    def _run_sync(self, recorder: Recorder, losses: _UpdateLoss, xbar: np.ndarray) -> None:
        """Global step t is complete once every real worker (and so every position) has ended
        iteration t. Its loss is on the real workers' batches: an emulated peer's batch is its
        owner's (testbed.emulation.peers), so with N a multiple of K that is the global batch's."""
        cfg, k = self.config, self.config.real_workers
        played = weights(cfg.workers, k)
        done: dict[int, dict[int, dict[str, Any]]] = {}  # iteration -> real worker -> info
        # rounds queued ahead, unless faults are injected (--fail): a worker told to die as round t
        # begins would otherwise take round t-1's report down with it, and the run would name the
        # wrong round
        depth = 1 if cfg.faults.fail.items else 2
        driver = _Driver(self.peers, "sync_step", cfg.steps, cfg.steps * k, cfg.cluster.timeout_s, depth=depth)
        for w, it, info, t_issue in driver:
            self._record(recorder, w, it, info, it, it, t_issue)
            done.setdefault(it, {})[w] = info
            while len(done.get(len(self.distances), {})) == k:  # global steps complete in order
                step, infos = len(self.distances), done.pop(len(self.distances))
                replicas = [x for r in range(k) for x in (infos[r]["params"], *infos[r]["peer_params"])]
                self.distances.append(consensus_distance(replicas))
                applied = sum(played[self.positions[r]] for r, i in infos.items() if not i["skipped"])
                losses.submit(step + 1, xbar, [(q, step) for q in self.positions],
                              max(i["t_end"] for i in infos.values()), applied)
                xbar = np.mean(replicas, axis=0).astype(np.float32)
                recorder.evaluate(step + 1, xbar)  # held-out: the average model after the step

    def _run_async(self, recorder: Recorder, losses: _UpdateLoss) -> None:
        cfg, n = self.config, self.config.workers
        driver = _Driver(self.peers, "async_step", None, cfg.steps, cfg.cluster.timeout_s)
        for version, (w, it, info, t_issue) in enumerate(driver, start=1):
            self._record(recorder, w, it, info, info["version_read"], info["version_applied"], t_issue)
            self.latest[w] = info["params"]
            replicas = [self.latest[r] for r in range(n)]
            self.distances.append(consensus_distance(replicas))
            xbar = np.mean(replicas, axis=0).astype(np.float32)
            losses.submit(version, xbar, [(w, it)], info["t_applied"], 0 if info["skipped"] else 1)
            recorder.evaluate(version, xbar)

    def _record(self, recorder: Recorder, w: int, it: int, info: dict[str, Any], read: int, applied: int,
                t_issue: float) -> None:
        """A gossip iteration; a skipped one (--on-nan skip) applied nothing. Its wait: from when
        it could start (issued, and its previous iteration over) to its start."""
        ready = max(t_issue, self.ended.get(w, t_issue))
        self.ended[w] = info["t_end"]
        if info["skipped"]:
            recorder.fault("nan-skipped", f"worker{self.positions[w]}", it, info["t_applied"], info["t_applied"])
        self.record(recorder, self.positions[w], it, info, version_read=read,
                    version_applied=None if info["skipped"] else applied,
                    wait_s=max(0.0, info["t_start"] - ready))

    def summary_extra(self) -> dict[str, Any]:
        cfg = self.config
        nbrs = neighbours(cfg.gossip.topology, cfg.workers)
        out = {
            "grad_bytes_logical": self.grad_bytes, "topology": cfg.gossip.topology,
            "asynchronous": cfg.gossip.asynchronous, "degree": self.degree,
            "spectral_gap": spectral_gap(mixing_matrix(nbrs)),
            "consensus_distance_initial": getattr(self, "initial_distance", None),
            "consensus_distance": self.distances,
            "consensus_distance_last": self.distances[-1] if self.distances else None,
        }
        return out

    def parameters(self) -> dict[str, np.ndarray]:
        """The average model (what decentralised SGD is evaluated by)."""
        return unflatten(np.mean(self.replica_parameters(), axis=0).astype(np.float32), self.layout)

    def replica_parameters(self) -> list[np.ndarray]:
        """Every position's replica, in position order (an emulated peer's from its owner)."""
        held = remote.get([p.get_replicas.remote() for p in self.peers], self.config.cluster.timeout_s, "replicas")
        return [x for xs in held for x in xs]

    def teardown(self) -> None:
        remote.kill_all(getattr(self, "peers", []))


class WorkerLost(RuntimeError):
    """A gossip worker's process died: gossip cannot go on without it."""

    def __init__(self, worker: int, iteration: int, t_issue: float, error: str) -> None:
        super().__init__(f"gossip: worker {worker} died during its iteration {iteration} ({error}); gossip "
                         "has no recovery (its neighbour graph is not rebuilt around a lost worker): use "
                         "ring, ps-sync or mapreduce, which restart a dead worker (--max-restarts)")
        self.worker, self.iteration, self.t_issue, self.error = worker, iteration, t_issue, error


class _Driver:
    """Keep `depth` steps in flight per worker; yield (worker, iteration, info, t_issue) as they end.

    `per_worker` caps each worker's iterations (synchronous); `total` caps all of them. With
    depth 2 (synchronous rounds, which a worker runs in order: GossipPeer.sync_step) a worker's
    next round waits in its actor while this one runs, so the driver's round trip never sits
    between two rounds; asynchronous steps keep depth 1 (one at a time, as issued).
    """

    def __init__(self, peers: list[Any], method: str, per_worker: int | None, total: int,
                 timeout: float, depth: int = 1) -> None:
        self.peers, self.method, self.per_worker, self.total = peers, method, per_worker, total
        self.timeout, self.depth = timeout, depth

    def __iter__(self):
        issued, next_it, inflight = 0, [0] * len(self.peers), {}
        pending = [0] * len(self.peers)

        def issue(w: int) -> None:
            nonlocal issued
            while (pending[w] < self.depth and issued < self.total
                   and (self.per_worker is None or next_it[w] < self.per_worker)):
                ref = getattr(self.peers[w], self.method).remote(next_it[w])
                inflight[ref] = (w, next_it[w], time.time())
                next_it[w] += 1
                pending[w] += 1
                issued += 1

        for w in range(len(self.peers)):
            issue(w)
        while inflight:
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=self.timeout)
            if not ready:
                busy = sorted(w for w, _, _ in inflight.values())
                raise remote.RemoteTimeout(f"gossip: no worker finished a step within {self.timeout:g}s "
                                           f"(workers {busy}); a neighbour may be dead or hung")
            w, it, t_issue = inflight.pop(ready[0])
            pending[w] -= 1
            try:
                info = remote.get(ready[0], self.timeout, f"gossip worker {w} step {it}")
            except ray.exceptions.RayActorError as exc:  # a process is gone (not an error it raised)
                dead = self._dead(exc, w)
                if dead != w:  # a neighbour's step failed first: the dead one's step is still in flight
                    it, t_issue = next(((i, t) for v, i, t in inflight.values() if v == dead), (it, t_issue))
                raise WorkerLost(dead, it, t_issue, type(exc).__name__) from None
            issue(w)
            yield w, it, info, t_issue


    def _dead(self, exc: BaseException, w: int) -> int:
        """The worker whose process died: worker w's own, or the neighbour w's step called (the
        error w raised then carries that actor's death as its cause)."""
        ids = {p._actor_id.hex(): r for r, p in enumerate(self.peers)}
        for err in (getattr(exc, "cause", None), exc):
            actor = getattr(err, "actor_id", None)
            if isinstance(actor, str) and actor in ids:
                return ids[actor]
        return w


class _UpdateLoss:
    """The average model's loss on each update's training batch, on a driver thread, emitting UpdateRecords
    in version order (held-out evaluation is testbed.session.evaluation's)."""

    def __init__(self, model: Any, recorder: Recorder) -> None:
        self.model, self.recorder = model, recorder
        self.jobs: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._work, name="gossip-eval", daemon=True)
        self.thread.start()

    def submit(self, version: int, xbar: np.ndarray, batch: list[tuple[int, int]], t_applied: float,
               contributors: int) -> None:
        if self.error is not None:
            raise self.error
        self.jobs.put((version, xbar, batch, t_applied, contributors))

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            version, xbar, batch, t_applied, contributors = job
            try:
                self.model.set_params(xbar)
                _, loss, _ = self.model.gradient(self.model.combine([self.model.batch(w, i) for w, i in batch]))
                self.recorder.update(UpdateRecord(version=version, t_applied=t_applied,
                                                  contributors=contributors,
                                                  dropped=len(batch) - contributors, loss=float(loss)))
            except BaseException as exc:  # noqa: BLE001 - surfaced on the driver's thread
                self.error = exc
                return

    def close(self, timeout: float) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=timeout)
        if self.error is not None:
            raise self.error
