"""The synthetic workload: no model, a gradient of any logical size after a set compute time.

Objective: f(w) = 1/2 ||w - w*||^2 on a flat vector split into `TENSORS` equal "layers".
Worker r's gradient at iteration i is (w - w*) + c(r, i) * z_r, where z_r is a fixed seeded
noise vector per worker and c a seeded scalar, so gradients are deterministic, differ across
workers, average exactly like real minibatch gradients, and cost one vector pass to produce.
The reported loss is the per-element mean of 1/2 (w - w*)^2; evaluation reports the same at the
parameters evaluated, without the noise (the population loss, whose optimum is 0).

`--payload scaled:F` keeps physical arrays at F of the logical size: every byte count and
emulated transfer uses the logical size (`logical_bytes`), memory and copies the physical one.
Compute time is slept (forward, then backward spread over the buckets it produces), so N
workers on a small machine do not compete for cores they would not share on a cluster.
`--workload profile:NAME` lays the vector out as a real model's tensors and spreads backward
by their FLOPs (testbed.workloads.profiles).
This module never imports torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from testbed.config import WorkloadConfig
from testbed.emulation.network import sleep_until
from testbed.workloads.base import Workload
from testbed.workloads.profiles import load_profile

TENSORS = 8
NOISE = 0.1


class SyntheticWorkload(Workload):
    optimum = 0.0  # the objective's minimum, at w = w*

    def __init__(self, cfg: WorkloadConfig, *, seed: int, workers: int) -> None:
        self.cfg, self.seed, self.workers = cfg, seed, workers
        if cfg.profile is not None:  # a real model's tensors (testbed.workloads.profiles)
            profile = load_profile(cfg.profile)
            self._logical = profile.numels
            self.logical_bytes = 4 * profile.params
            physical = [max(1, int(round(n * cfg.payload.scale))) for n in self._logical]
            self.layout = [(name, (n,)) for name, n in zip(profile.names, physical, strict=True)]
            flops = sum(profile.backward_flops)
            self.backward_share = [f / flops for f in profile.backward_flops]
            self.numel = sum(physical)
        else:
            logical_elems = max(1, int(cfg.grad_mb * 2**20) // 4)
            self.logical_bytes = logical_elems * 4
            self.numel = max(TENSORS, int(round(logical_elems * cfg.payload.scale)))
            per, extra = divmod(self.numel, TENSORS)
            self.layout = [(f"layer{i}", (per + (1 if i < extra else 0),)) for i in range(TENSORS)]
            self._logical = None
            self.backward_share = [shape[0] / self.numel for _, shape in self.layout]
        self.target = np.random.default_rng([seed, 3]).standard_normal(self.numel, dtype=np.float32)
        self.w = np.zeros(self.numel, dtype=np.float32)
        self._noise: dict[int, np.ndarray] = {}

    def logical_sizes(self) -> list[int]:
        return list(self._logical) if self._logical is not None else super().logical_sizes()

    def get_params(self) -> np.ndarray:
        return self.w.copy()

    def set_params(self, flat: np.ndarray) -> None:
        np.copyto(self.w, flat)

    def apply_update(self, grad: np.ndarray, optimizer: Any) -> None:
        optimizer.step(self.w, np.asarray(grad, dtype=np.float32))

    def evaluate(self, flat: np.ndarray, samples: int) -> dict[str, float | None]:
        """The noise-free objective at `flat` (the population loss; there is no held-out split)."""
        diff = np.asarray(flat, dtype=np.float32) - self.target
        return {"loss": float(0.5 * np.mean(diff * diff)), "acc": None}

    def batch(self, worker: int, iteration: int) -> list[tuple[int, int]]:
        return [(worker, iteration)]

    def combine(self, batches: Sequence[list[tuple[int, int]]]) -> list[tuple[int, int]]:
        return [key for b in batches for key in b]

    def _noise_for(self, worker: int) -> np.ndarray:
        if worker not in self._noise:
            rng = np.random.default_rng([self.seed, 5, worker])
            self._noise[worker] = rng.standard_normal(self.numel, dtype=np.float32)
        return self._noise[worker]

    def _scale(self, worker: int, iteration: int) -> np.float32:
        return np.float32(NOISE * np.random.default_rng([self.seed, 9, worker, iteration]).random())

    def _exact_gradient(self, batch: list[tuple[int, int]]) -> tuple[np.ndarray, float]:
        diff = self.w - self.target
        grad = diff.copy()
        noise = np.zeros_like(grad)
        for worker, iteration in batch:
            noise += self._scale(worker, iteration) * self._noise_for(worker)
        grad += noise / np.float32(len(batch))
        return grad, float(0.5 * np.mean(diff * diff))

    def gradient(self, batch: list[tuple[int, int]]) -> tuple[np.ndarray, float, int]:
        t_end = time.perf_counter() + self.cfg.compute_ms / 1000.0
        grad, loss = self._exact_gradient(batch)
        _sleep_until(t_end)
        return grad, loss, self.cfg.batch_size * len(batch)

    def gradient_buckets(
        self, batch: list[tuple[int, int]], buckets: list[list[int]],
        on_ready: Callable[[int, np.ndarray], None],
    ) -> tuple[np.ndarray, float, int]:
        """Forward, then each bucket after its share of the backward time (last layers first):
        the share of its tensors' elements, or of their backward FLOPs under a profile. Time
        spent in `on_ready` (a straggler's sleep: testbed.emulation.stragglers.Stretch) delays
        the rest of backward, as a hook does a real backward pass; on a schedule fixed at the
        start, the later buckets would come at once after it, and the delay would vanish."""
        total = self.cfg.compute_ms / 1000.0
        t = time.perf_counter() + total * (1 - self.cfg.backward_frac)
        grad, loss = self._exact_gradient(batch)
        _sleep_until(t)
        backward = total * self.cfg.backward_frac
        for b, idx in enumerate(buckets):
            view = self.bucket_view(grad, idx)
            t += backward * sum(self.backward_share[i] for i in idx)
            _sleep_until(t)
            hook = time.perf_counter()
            on_ready(b, view)
            t += time.perf_counter() - hook
        return grad, loss, self.cfg.batch_size * len(batch)


def _sleep_until(t: float) -> None:
    sleep_until(t, clock=time.perf_counter)
