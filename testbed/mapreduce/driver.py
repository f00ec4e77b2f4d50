"""MapReduce-style synchronous SGD: the driver broadcasts, workers map, the driver reduces.

    step v:   driver --put(params_v)--> object store            (one object, not N copies)
              worker r: fetch params_v, gradient g_r on its batch (map)
              driver: g = (1/N) sum_r g_r, params_{v+1} = step(params_v, g)  (reduce + apply)

Every byte goes through the driver: per step it sends K to each of N workers and receives N
gradients of K bytes, so its NIC moves 2NK and the step costs 2(a + N K / B) at the driver in
the alpha-beta model — the bottleneck grows linearly with N. Gradients are averaged (not
summed), so the result equals single-process training on the concatenated global batch; the
optimizer (sgd, momentum, adam: testbed.training.optim) and its state live in the driver.

Faults: a worker that dies or hangs (--timeout) is restarted by Ray (--max-restarts) and the
step is redone from the same parameters and batches, so the result equals the no-fault run. A
non-finite gradient is never applied: it is left out of the average (--on-nan skip) or stops
the run (--on-nan stop).

Emulated peers (`--real-workers K < N`, testbed.emulation.peers): the driver sends every position
its parameters and queues every position's gradient on its NIC; a real worker receives, computes
and sends for its peers on their NICs (`SegmentNics`), and its gradient counts once per position
it stands for, summed in position order: the run equals one process stepping the owner-weighted
mean (testbed.workloads.reference).

Timing per worker iteration, measured by the driver with arrival times from ray.wait:
comm = (arrival - issue) - compute - injected delay (parameter fetch + gradient return),
wait = last arrival - own arrival (the barrier) + the driver's reduce/apply time.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import ray

from testbed.analysis.records import Recorder, UpdateRecord
from testbed.emulation.endpoint import Endpoint
from testbed.emulation.faults import NanPolicy
from testbed.emulation.network import sleep_until
from testbed.emulation.peers import segment_sizes
from testbed.runtime import remote
from testbed.runtime.worker import WorkerBase
from testbed.strategies.contract import Strategy
from testbed.training.compressor import Compressor
from testbed.training.optim import Optimizer, mean_gradient, optimizer_for
from testbed.workloads import make_workload


class MapReduce(Strategy):
    def setup(self) -> None:
        cfg = self.config
        # the real workers only (--real-workers): known by index here, by position in the records
        self.copies = segment_sizes(cfg.workers, cfg.real_workers)  # the emulated peers each plays
        self.workers = remote.spawn(WorkerBase, self.cluster, cfg.real_workers, cfg, device=self.cluster.device,
                                    max_restarts=cfg.faults.max_restarts, concurrency=2)
        self.model = make_workload(cfg.workload, seed=cfg.seed, workers=cfg.workers)  # layout and sizes
        # the workers' initial parameters, not this process's: on a GPU the workers build the torch
        # model, here its numpy twin (same layout, another generator) may stand in for it. The
        # workers' first call: it waits for their processes to start (a restart's allowance)
        first = remote.get(self.workers[0].get_params.remote(), remote.startup_timeout(cfg.cluster.timeout_s),
                           "initial parameters")
        self.params = np.array(first, dtype=np.float32, copy=True)  # the store's view is read-only; it is stepped in place
        self.optimizer = Optimizer(optimizer_for(cfg.workload))
        self.endpoint = Endpoint(cfg.network, "driver")
        spec = cfg.compression
        self.decompressor = Compressor(spec, self.params.size) if spec.kind != "none" else None
        self.nan = NanPolicy(cfg.faults.on_nan)
        self.liveness = remote.Liveness(self.workers, cfg.cluster.timeout_s, "worker")

    def run(self, recorder: Recorder) -> None:
        cfg = self.config
        self.k = self.model.logical_bytes
        if recorder.wants_eval(0):
            recorder.evaluate(0, self.params.copy())
        for step in range(cfg.steps):
            while True:
                t_issue = time.time()
                try:
                    results, arrivals = self._map(step)
                    break
                except remote.ACTOR_ERRORS as exc:  # a worker died or hung: revive, redo the step
                    for r in self.liveness.revive():
                        recorder.fault("worker-restart", f"worker{self.positions[r]}", step, t_issue, time.time(),
                                       cause=type(exc).__name__)
            self._reduce(recorder, step, t_issue, results, arrivals)
            if recorder.wants_eval(step + 1):
                recorder.evaluate(step + 1, self.params.copy())
        recorder.events_from(remote.drain_events(self.workers, cfg.cluster.timeout_s))

    def _map(self, step: int) -> tuple[list[Any], dict[int, float]]:
        """Broadcast params once, collect every gradient with its arrival time at the driver."""
        cfg, n = self.config, len(self.workers)
        ref = ray.put(self.params)
        pending = {}
        for r, w in enumerate(self.workers):  # on the egress in position order, emulated peers too
            own = self.endpoint.send(self.k)
            peers = [self.endpoint.send(self.k) for _ in range(self.copies[r])]
            pending[w.compute_at.remote(ref, step, own, peers)] = r
        arrivals: dict[int, float] = {}
        deadline = time.monotonic() + cfg.cluster.timeout_s
        while len(arrivals) < n:
            ready, _ = ray.wait([p for p in pending if pending[p] not in arrivals],
                                num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise remote.RemoteTimeout(f"mapreduce step {step}: workers "
                                           f"{sorted(self.positions[r] for r in set(range(n)) - set(arrivals))} "
                                           "did not answer "
                                           f"within {cfg.cluster.timeout_s:g}s")
            arrivals[pending[ready[0]]] = time.time()
        results = remote.get(list(pending), cfg.cluster.timeout_s, "mapreduce gradients")
        if self.endpoint.emulated:  # gradients queue at the driver's ingress, in arrival order
            for r in sorted(arrivals, key=arrivals.get):
                info = results[r][1]
                own, copies = self.endpoint.deliveries(info["bytes_sent"], info["departure"],
                                                       info["peer_departures"], arrivals[r])
                sleep_until(max([own, *copies]))
                arrivals[r] = time.time()
        if self.decompressor is not None:
            results = [(self.decompressor.decompress(g), info) for g, info in results]
        return results, arrivals

    def _reduce(self, recorder: Recorder, step: int, t_issue: float, results: list[Any],
                arrivals: dict[int, float]) -> None:
        """Average the finite gradients, apply, record (a NaN gradient is never applied)."""
        t_reduce = time.time()
        finite = [self.nan.admit(g, f"mapreduce step {step}: worker {self.positions[r]}'s gradient")
                  for r, (g, _) in enumerate(results)]
        # in position order: each real worker's gradient once for itself and once per emulated peer
        used = [g for (g, _), ok, m in zip(results, finite, self.copies, strict=True) if ok for _ in range(m + 1)]
        if used:
            self.optimizer.step(self.params, mean_gradient(used))
        t_applied = time.time()
        recorder.event("driver", "reduce", t_reduce, t_applied)
        last = max(arrivals.values())
        for r, (_, info) in enumerate(results):
            if not finite[r]:
                recorder.fault("nan-skipped", f"worker{self.positions[r]}", step, t_reduce, t_reduce)
            # the step's time at the driver less the worker's compute: on one machine never below 0
            # (the gradient exists only after it); across machines the clocks' offset shows here, unclamped
            info.update(t_start=t_issue, bytes_recv=self.k,
                        comm_s=arrivals[r] - t_issue - info["compute_s"] - info["injected_delay_s"])
            info.pop("peer_departures", None)
            self.record(recorder, self.positions[r], step, info, version_read=step,
                        version_applied=step if finite[r] else None,
                        wait_s=(last - arrivals[r]) + (t_applied - t_reduce))
        losses = [info["loss"] for (_, info), ok, m in zip(results, finite, self.copies, strict=True) if ok
                  for _ in range(m + 1)]
        recorder.update(UpdateRecord(version=step + 1, t_applied=t_applied, contributors=len(used),
                                     dropped=self.config.workers - len(used),
                                     loss=float(np.mean(losses)) if losses else float("nan")))

    def summary_extra(self) -> dict[str, Any]:
        k = self.model.logical_bytes
        push = self.config.compression.wire_bytes(k)
        return {"grad_bytes_logical": k, "driver_bytes_per_step": int(self.config.workers * (k + push)),
                "endpoint_late_s": self.endpoint.late_s}

    def parameters(self) -> dict[str, np.ndarray]:
        return self.model.unflatten(self.params)

    def teardown(self) -> None:
        remote.kill_all(getattr(self, "workers", []))
