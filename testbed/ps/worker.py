"""The PS client side of a worker: pull every shard, compute, push every shard, in one call.

The driver only schedules iterations (and holds workers back under SSP); parameters and
gradients go directly between workers and shards, all shards in parallel.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import ray

from testbed.worker import WorkerBase


class PSWorker(WorkerBase):
    def connect(self, shards: list[Any], bounds: list[tuple[int, int]]) -> None:
        self.shards, self.bounds = shards, bounds

    def iteration(self, iteration: int, min_version: int) -> dict[str, Any]:
        """Pull (blocking until min_version), compute, push; return timings and the shards' acks."""
        timeout = self.config.cluster.timeout_s
        t0 = time.time()
        pulled = ray.get([s.pull.remote(min_version, timeout) for s in self.shards], timeout=timeout)
        for (lo, hi), (_, _, _, departure) in zip(self.bounds, pulled, strict=True):
            self.endpoint.receive(int((hi - lo) * 4 * self.logical_factor), departure)
        params = np.concatenate([p for p, _, _, _ in pulled]) if len(pulled) > 1 else pulled[0][0]
        versions = [v for _, v, _, _ in pulled]
        server_wait = max(w for _, _, w, _ in pulled)
        t_pulled = time.time()
        self.span("recv", t0, t_pulled)
        self.workload.set_params(params)
        grad, info = self.compute(iteration)
        t_pushing = time.time()
        refs = []
        for shard, (lo, hi), v in zip(self.shards, self.bounds, versions, strict=True):
            departure = self.endpoint.send(int((hi - lo) * 4 * self.logical_factor))
            refs.append(shard.push.remote(grad[lo:hi], v, self.rank, iteration, info["loss"], departure))
        acks = ray.get(refs, timeout=timeout)
        t_done = time.time()
        self.span("send", t_pushing, t_done)
        k = int(self.workload.numel * 4 * self.logical_factor)
        return {**info, "t_start": t0, "versions": versions, "acks": acks, "server_wait_s": server_wait,
                "comm_s": max(0.0, t_pulled - t0 - server_wait) + (t_done - t_pushing),
                "bytes_sent": k, "bytes_recv": k, "t_end": t_done}
