"""The PS client side of a worker: pull every shard, compute, push every shard, in one call.

The driver only schedules iterations (and holds workers back under SSP); parameters and
gradients go directly between workers and shards, all shards in parallel.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import ray

from testbed.runtime.worker import WorkerBase


class PSWorker(WorkerBase):
    def connect(self, shards: list[Any], bounds: list[tuple[int, int]]) -> None:
        self.shards, self.bounds = shards, bounds

    def iteration(self, iteration: int, min_version: int, epoch: int = 0) -> dict[str, Any]:
        """Pull (blocking until min_version), compute, push; return timings and the shards' acks.

        Returns {"reset": True} without computing when a shard rolled back meanwhile.
        """
        timeout = self.config.cluster.timeout_s
        t0 = time.time()
        pulled = ray.get([s.pull.remote(min_version, timeout, epoch) for s in self.shards], timeout=timeout)
        if any(p[4] != epoch for p in pulled):
            return {"reset": True}
        for (lo, hi), p in zip(self.bounds, pulled, strict=True):
            self.endpoint.receive(int((hi - lo) * 4 * self.logical_factor), p[3])
        params = np.concatenate([p[0] for p in pulled]) if len(pulled) > 1 else pulled[0][0]
        versions = [p[1] for p in pulled]
        server_wait = max(p[2] for p in pulled)
        t_pulled = time.time()
        self.span("recv", t0, t_pulled)
        self.workload.set_params(params)
        grad, info = self.compute(iteration)
        t_pushing = time.time()
        refs = []
        sent = 0
        for shard, (lo, hi), v in zip(self.shards, self.bounds, versions, strict=True):
            payload = self.outgoing(grad, lo, hi)
            nbytes = int(payload.nbytes * self.logical_factor)
            sent += nbytes
            departure = self.endpoint.send(nbytes)
            refs.append(shard.push.remote(payload, v, self.rank, iteration, info["loss"], departure, epoch))
        acks = ray.get(refs, timeout=timeout)
        t_done = time.time()
        self.span("send", t_pushing, t_done)
        k = int(self.workload.numel * 4 * self.logical_factor)
        return self.report({**info, "t_start": t0, "versions": versions, "acks": acks,
                            "server_wait_s": server_wait,
                            "comm_s": max(0.0, t_pulled - t0 - server_wait) + (t_done - t_pushing),
                            "bytes_sent": sent, "bytes_recv": k, "t_end": t_done})
