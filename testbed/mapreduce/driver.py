"""MapReduce-style synchronous SGD: the driver broadcasts, workers map, the driver reduces.

    step v:   driver --put(params_v)--> object store            (one object, not N copies)
              worker r: fetch params_v, gradient g_r on its batch (map)
              driver: g = (1/N) sum_r g_r, params_{v+1} = params_v - lr g   (reduce + apply)

Every byte goes through the driver: per step it sends K to each of N workers and receives N
gradients of K bytes, so its NIC moves 2NK and the step costs 2(a + N K / B) at the driver in
the alpha-beta model — the bottleneck grows linearly with N. Gradients are averaged (not
summed), so the result equals single-process SGD on the concatenated global batch.

Timing per worker iteration, measured by the driver with arrival times from ray.wait:
comm = (arrival - issue) - compute - injected delay (parameter fetch + gradient return),
wait = last arrival - own arrival (the barrier) + the driver's reduce/apply time.
"""

from __future__ import annotations

import time

import numpy as np
import ray

from testbed import remote
from testbed.emulation import Endpoint
from testbed.strategy import Recorder, StepRecord, Strategy, UpdateRecord
from testbed.worker import WorkerBase
from testbed.workloads import make_workload

MapWorker = ray.remote(WorkerBase)


class MapReduce(Strategy):
    name = "mapreduce"
    family = "mapreduce"

    def setup(self) -> None:
        cfg = self.config
        self.workers = remote.spawn(MapWorker, self.cluster, cfg.workers, cfg,
                                    device=self.cluster.device)
        self.model = make_workload(cfg.workload, seed=cfg.seed, workers=cfg.workers)
        self.params = self.model.get_params()
        self.endpoint = Endpoint(cfg.network, "driver")
        remote.get([w.ping.remote() for w in self.workers], cfg.cluster.timeout_s, "worker start-up")

    def run(self, recorder: Recorder) -> None:
        cfg, n = self.config, self.config.workers
        k_logical = self.model.logical_bytes
        for step in range(cfg.steps):
            t_issue = time.time()
            ref = ray.put(self.params)
            pending = {w.compute_at.remote(ref, step, self.endpoint.send(k_logical)): r
                       for r, w in enumerate(self.workers)}
            arrivals: dict[int, float] = {}
            deadline = time.monotonic() + cfg.cluster.timeout_s
            while len(arrivals) < n:
                ready, _ = ray.wait([p for p in pending if pending[p] not in arrivals],
                                    num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
                if not ready:
                    raise remote.RemoteTimeout(f"mapreduce step {step}: workers "
                                               f"{sorted(set(range(n)) - set(arrivals))} did not answer "
                                               f"within {cfg.cluster.timeout_s:g}s")
                arrivals[pending[ready[0]]] = time.time()
            results = remote.get(list(pending), cfg.cluster.timeout_s, "mapreduce gradients")
            if self.endpoint.emulated:  # gradients queue at the driver's ingress, in arrival order
                for r in sorted(arrivals, key=arrivals.get):
                    self.endpoint.receive(k_logical, results[r][1]["departure"])
                    arrivals[r] = time.time()
            t_reduce = time.time()
            grad = np.mean(np.stack([g for g, _ in results]), axis=0, dtype=np.float32)
            self.params = self.params - np.float32(cfg.workload.lr) * grad
            t_applied = time.time()
            recorder.event("driver", "reduce", t_reduce, t_applied)
            last = max(arrivals.values())
            losses = []
            for r, (_, info) in enumerate(results):
                rtt = arrivals[r] - t_issue
                comm = max(0.0, rtt - info["compute_s"] - info["injected_delay_s"])
                losses.append(info["loss"])
                recorder.step(StepRecord(
                    run_id=self.run_id, strategy=self.name, worker=r, iteration=step,
                    version_read=step, version_applied=step, t_start=t_issue,
                    compute_s=info["compute_s"], comm_s=comm,
                    wait_s=(last - arrivals[r]) + (t_applied - t_reduce),
                    bytes_sent=k_logical, bytes_recv=k_logical, samples=info["samples"],
                    loss=info["loss"], staleness=0, injected_delay_s=info["injected_delay_s"]))
            recorder.update(UpdateRecord(version=step + 1, t_applied=t_applied, contributors=n,
                                         dropped=0, loss=float(np.mean(losses))))
        recorder.events_from([e for w in self.workers
                              for e in remote.get(w.drain_events.remote(), cfg.cluster.timeout_s, "events")])
        recorder.extra.update(driver_bytes_per_step=2 * n * k_logical, grad_bytes_logical=k_logical)

    def parameters(self) -> dict[str, np.ndarray]:
        return self.model.unflatten(self.params)

    def teardown(self) -> None:
        remote.kill_all(getattr(self, "workers", []))
