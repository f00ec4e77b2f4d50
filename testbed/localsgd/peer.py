"""Local SGD's worker: the allreduce's peer (wiring, transports, schedules, recovery state) with
another training step -- a step of its own, and at the end of a round the replicas' average.

    iteration t:  gradient of its own batch -> its optimizer steps its own replica
    round ends:   sum the replica bucket by bucket with the peers (--algorithm), / N,
                  outer step (testbed.localsgd.outer) -> every replica starts the next round equal

The average is the allreduce's, applied to the parameters instead of the gradient, so its
messages, emulated delivery and bytes are counted exactly as the ring's.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from testbed.allreduce.peer import RingPeer
from testbed.localsgd.outer import OuterStep, ends_round


class LocalSGDPeer(RingPeer):
    def __init__(self, config: Any, rank: int, device: str = "cpu", cpus: float = 1.0,
                 library: bool = False) -> None:
        super().__init__(config, rank, device, cpus, library)
        own = config.localsgd
        self.local_steps = own.local_steps
        self.outer = OuterStep(own.outer_optimizer, own.outer_lr, own.outer_momentum)
        self.anchor = None  # the round's start: set with the first iteration

    def peer_delays(self, iteration: int, since: int | None = None) -> np.ndarray:
        """An emulated peer's lag at a round's average: its straggler delays beyond its owner's,
        added up over the round's local steps (it takes them as its owner does, unsynchronised)."""
        return super().peer_delays(iteration, iteration - iteration % self.local_steps if since is None else since)

    def run_step(self, iteration: int, attempt: int = 0, send_params: bool = False) -> dict[str, Any]:
        """One local step; at the end of a round, the average and the outer step."""
        t_start = time.time()
        self.attempt = attempt
        self._deferred = None
        if self.anchor is None:
            self.anchor = self.workload.get_params()
        batch = self.workload.batch(self.rank, iteration)
        grad, info = self.gradient(iteration, batch)
        t_a0 = time.time()
        finite = self.nan.admit(grad, f"step {iteration}: worker {self.rank}'s own gradient")
        if finite:
            self.workload.apply_update(grad, self.optimizer)
        t_a1 = time.time()
        self.span("apply", t_a0, t_a1)
        bucket_s = [0.0] * len(self.buckets)
        sent = [0, 0]
        if ends_round(iteration, self.local_steps, self.config.steps) and self.n > 1:
            params = self.workload.get_params()
            ready = time.time()  # every bucket of the replica is ready at once
            for b, idx in enumerate(self.buckets):
                bucket_s[b], out, into = self._reduce_bucket(iteration, b, self.workload.bucket_view(params, idx),
                                                             ready)
                sent[0] += out
                sent[1] += into
            if self.transport is not None:
                self.transport.settle()
            self.anchor = self.outer.step(self.anchor, params / self.n)
            self.workload.set_params(self.anchor)
        elif ends_round(iteration, self.local_steps, self.config.steps):  # alone: its replica is the mean
            self.anchor = self.outer.step(self.anchor, self.workload.get_params())
            self.workload.set_params(self.anchor)
        t_end = time.time()
        if self._deferred is not None:  # emulated peers: the average ends at the model's end of its last bucket
            t_end = self._finish_deferred(bucket_s)
        extra = {"params": self.workload.get_params()} if send_params else {}
        return self.report({**extra, **info, "t_start": t_start, "comm_s": t_end - t_a1,
                            "apply_s": (t_a1 - t_a0), "bucket_s": bucket_s,
                            "bytes_sent": int(sent[0] * self.logical_factor),
                            "bytes_recv": int(sent[1] * self.logical_factor), "t_end": t_end,
                            "applied": finite})
