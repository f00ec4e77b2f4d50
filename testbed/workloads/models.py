"""Real models trained with autograd: `logreg` (softmax regression) and `mlp` (one hidden layer).

Parameters live in one flat tensor and every `nn.Parameter` is a view into it; gradients
accumulate into views of one flat gradient tensor. Moving parameters or gradients to and from
the transport is therefore one contiguous copy, and backward hooks can hand out finished
buckets (contiguous slices) while backward goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from testbed.config import WorkloadConfig
from testbed.workloads.base import Workload
from testbed.workloads.data import batch_indices, make_dataset, shard_indices


def build_model(cfg: WorkloadConfig) -> nn.Module:
    if cfg.name == "logreg":
        return nn.Linear(cfg.features, cfg.classes)
    return nn.Sequential(
        nn.Linear(cfg.features, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, cfg.classes)
    )


class TorchWorkload(Workload):
    def __init__(self, cfg: WorkloadConfig, *, seed: int, workers: int, device: str = "cpu") -> None:
        self.cfg, self.seed, self.workers = cfg, seed, workers
        self.device = torch.device(device)
        torch.manual_seed(seed)
        model = build_model(cfg).to(self.device)  # move first: the views below must stay put
        self.layout = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
        self.numel = sum(p.numel() for p in model.parameters())
        self.logical_bytes = self.numel * 4
        self.flat = torch.zeros(self.numel, dtype=torch.float32, device=self.device)
        self.flat_grad = torch.zeros_like(self.flat)
        start = 0
        for p in model.parameters():
            n = p.numel()
            self.flat[start:start + n].copy_(p.data.reshape(-1))
            p.data = self.flat[start:start + n].view_as(p)
            p.grad = self.flat_grad[start:start + n].view_as(p)
            start += n
        self.model = model
        self.params = list(self.model.parameters())
        x, y = make_dataset(seed, cfg.samples, cfg.features, cfg.classes)
        self.x = torch.from_numpy(x).to(self.device)
        self.y = torch.from_numpy(y).to(self.device)
        self._shards: dict[int, np.ndarray] = {}
        self.loss_fn = nn.CrossEntropyLoss()

    # ---- parameters
    def get_params(self) -> np.ndarray:
        return self.flat.detach().cpu().numpy().copy()

    def set_params(self, flat: np.ndarray) -> None:
        arr = np.asarray(flat, dtype=np.float32)
        if not arr.flags.writeable:  # zero-copy object-store views are read-only
            arr = arr.copy()
        with torch.no_grad():
            self.flat.copy_(torch.from_numpy(arr))

    def apply_update(self, grad: np.ndarray | torch.Tensor, lr: float) -> None:
        g = torch.as_tensor(grad, device=self.device)
        with torch.no_grad():
            self.flat.sub_(g.to(torch.float32), alpha=lr)

    # ---- data
    def batch(self, worker: int, iteration: int) -> np.ndarray:
        if worker not in self._shards:
            self._shards[worker] = shard_indices(self.seed, self.cfg.samples, self.workers, worker)
        return batch_indices(self.seed, self._shards[worker], worker, iteration, self.cfg.batch_size)

    def combine(self, batches: Sequence[np.ndarray]) -> np.ndarray:
        return np.concatenate(list(batches))

    # ---- gradients
    def _forward_backward(self, batch: np.ndarray) -> tuple[float, int]:
        idx = torch.from_numpy(batch).to(self.device)
        self.flat_grad.zero_()
        loss = self.loss_fn(self.model(self.x[idx]), self.y[idx])
        loss.backward()
        return float(loss.detach()), len(batch)

    def gradient(self, batch: np.ndarray) -> tuple[np.ndarray, float, int]:
        loss, samples = self._forward_backward(batch)
        return self.flat_grad.detach().cpu().numpy().copy(), loss, samples

    def gradient_tensor(self, batch: np.ndarray) -> tuple[torch.Tensor, float, int]:
        """Like gradient() but leaves the result on the device (GPU reductions)."""
        loss, samples = self._forward_backward(batch)
        return self.flat_grad, loss, samples

    def gradient_buckets(
        self, batch: np.ndarray, buckets: list[list[int]], on_ready: Callable[[int, torch.Tensor], None]
    ) -> tuple[torch.Tensor, float, int]:
        """Backward with hooks: a bucket is handed out the moment its last tensor's grad is done."""
        remaining = [len(b) for b in buckets]
        owner = {i: b for b, idx in enumerate(buckets) for i in idx}
        bounds = [self.bucket_slice(idx) for idx in buckets]
        handles = []

        def hook_for(tensor_index: int):
            def hook(_p: torch.Tensor) -> None:
                b = owner[tensor_index]
                remaining[b] -= 1
                if remaining[b] == 0:
                    on_ready(b, self.flat_grad[bounds[b]])
            return hook

        for i, p in enumerate(self.params):
            handles.append(p.register_post_accumulate_grad_hook(hook_for(i)))
        try:
            loss, samples = self._forward_backward(batch)
            return self.flat_grad, loss, samples
        finally:
            for h in handles:
                h.remove()
