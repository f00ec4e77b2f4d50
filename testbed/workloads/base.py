"""The workload interface: flat float32 parameters, per-(worker, iteration) batches, gradients.

Parameters and gradients travel as one flat float32 vector; `layout` names its slices. Batches
are addressed by (worker, iteration) so that a single-process reference can rebuild the exact
global batch of any step (`combine` of the workers' batches) and check equivalence.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


class Workload(ABC):
    #: [(name, shape)] in model order; the flat vector is their concatenation
    layout: list[tuple[str, tuple[int, ...]]]
    #: float32 elements that physically travel (smaller than logical for scaled payloads)
    numel: int
    #: bytes a gradient counts for on the (emulated) network
    logical_bytes: int

    @abstractmethod
    def get_params(self) -> np.ndarray:
        """Return the flat float32 parameters (a copy)."""

    @abstractmethod
    def set_params(self, flat: np.ndarray) -> None:
        """Overwrite the parameters from a flat float32 vector."""

    @abstractmethod
    def batch(self, worker: int, iteration: int) -> Any:
        """Return worker's batch for its iteration (deterministic)."""

    @abstractmethod
    def combine(self, batches: Sequence[Any]) -> Any:
        """Concatenate batches of equal size into one global batch."""

    @abstractmethod
    def gradient(self, batch: Any) -> tuple[np.ndarray, float, int]:
        """Return (flat float32 mean gradient, mean loss, samples) at the current parameters."""

    def gradient_buckets(
        self, batch: Any, buckets: list[list[int]], on_ready: Callable[[int, np.ndarray], None]
    ) -> tuple[Any, float, int]:
        """Compute the gradient, calling on_ready(bucket_index, flat_bucket) as each completes.

        Returns (flat gradient buffer whose bucket views were handed out, loss, samples).
        Default: whole backward first, then every bucket in order (no overlap possible).
        """
        grad, loss, samples = self.gradient(batch)
        for b, idx in enumerate(buckets):
            on_ready(b, self.bucket_view(grad, idx))
        return grad, loss, samples

    #: the best held-out loss achievable, where the data make it known (else None)
    optimum: float | None = None

    def apply_update(self, grad: Any, optimizer: Any) -> None:
        """One step of `optimizer` (testbed.training.optim) on the local replica, from the averaged gradient."""
        params = self.get_params()
        optimizer.step(params, np.asarray(grad, dtype=np.float32))
        self.set_params(params)

    @abstractmethod
    def evaluate(self, flat: np.ndarray, samples: int) -> dict[str, float | None]:
        """{"loss", "acc"} of the parameters `flat` on `samples` of the held-out split (acc None
        where the task has none)."""

    def logical_sizes(self) -> list[int]:
        """Each tensor's logical float32 elements (what buckets are formed from): the physical
        ones scaled up, unless the workload knows them exactly (a profile's)."""
        factor = self.logical_bytes / (4 * self.numel)
        return [int(round(int(np.prod(shape, dtype=np.int64)) * factor)) for _, shape in self.layout]

    def countdown(self, buckets: list[list[int]], flat_grad: Any,
                  on_ready: Callable[[int, Any], None]) -> Callable[[int], None]:
        """`done(tensor)` for a backward pass to call as each tensor's gradient is written: it
        hands bucket b (a view of `flat_grad`) to on_ready once its last tensor is done."""
        remaining = [len(b) for b in buckets]
        owner = {i: b for b, idx in enumerate(buckets) for i in idx}
        bounds = [self.bucket_slice(idx) for idx in buckets]

        def done(tensor: int) -> None:
            b = owner[tensor]
            remaining[b] -= 1
            if remaining[b] == 0:
                on_ready(b, flat_grad[bounds[b]])
        return done

    # ---- flat-vector helpers
    def slices(self) -> list[slice]:
        out, start = [], 0
        for _, shape in self.layout:
            n = int(np.prod(shape, dtype=np.int64))
            out.append(slice(start, start + n))
            start += n
        return out

    def bucket_slice(self, idx: list[int]) -> slice:
        """Bucket tensors are contiguous in the flat vector (make_buckets keeps neighbours)."""
        sl = self.slices()
        lo = min(sl[i].start for i in idx)
        hi = max(sl[i].stop for i in idx)
        return slice(lo, hi)

    def bucket_view(self, flat: np.ndarray, idx: list[int]) -> np.ndarray:
        return flat[self.bucket_slice(idx)]

    def unflatten(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        return unflatten(flat, self.layout)


def unflatten(flat: np.ndarray, layout: list[tuple[str, tuple[int, ...]]]) -> dict[str, np.ndarray]:
    """Split a flat vector into named arrays of the layout's shapes."""
    out, start = {}, 0
    for name, shape in layout:
        size = int(np.prod(shape, dtype=np.int64))
        out[name] = np.asarray(flat[start:start + size]).reshape(shape).copy()
        start += size
    return out
