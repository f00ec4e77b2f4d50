"""Real models trained with autograd: `logreg`, `mlp`, `resnet` and `transformer` (testbed.workloads.nets).

Parameters live in one flat tensor and every `nn.Parameter` is a view into it; gradients
accumulate into views of one flat gradient tensor. Moving parameters or gradients to and from
the transport is therefore one contiguous copy, and backward hooks can hand out finished
buckets (contiguous slices) while backward goes on.

Data (numpy, made or read per batch): Gaussian blobs for mlp/logreg, prototype images for the
ResNet (`images.py`), the synthetic Markov language for the transformer (`language.py`), or the
files of `--data`. Evaluation (`evaluate`) scores a flat parameter vector on the held-out split:
mean cross-entropy per sample (per token for the language model) and top-1 accuracy; batch-norm
statistics are recomputed for those parameters first (`nets.calibrate`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from testbed.config import WorkloadConfig
from testbed.workloads.base import Workload
from testbed.workloads.data import Shards, make_source
from testbed.workloads.nets import calibrate, classifier, language_model

CALIBRATION = 256  # training samples whose batch statistics a ResNet is evaluated with
EVAL_CHUNK = 256  # held-out samples per forward pass


def build_model(cfg: WorkloadConfig, source: Any) -> nn.Module:
    if cfg.name == "transformer":
        return language_model(source.vocab, cfg.d_model, cfg.layers, cfg.heads, cfg.seq_len)
    return classifier(cfg.name, source.shape, source.classes, hidden=cfg.hidden, width=cfg.width,
                      depth=cfg.depth, group=cfg.batch_size)


class TorchWorkload(Workload):
    def __init__(self, cfg: WorkloadConfig, *, seed: int, workers: int, device: str = "cpu") -> None:
        self.cfg, self.seed, self.workers = cfg, seed, workers
        self.device = torch.device(device)
        self.source = make_source(cfg, seed)
        self.optimum = getattr(self.source, "optimum", None)
        self.language = cfg.name == "transformer"
        self.flatten = cfg.name in ("mlp", "logreg")  # they see an image as its pixels in a row
        torch.manual_seed(seed)
        model = build_model(cfg, self.source).to(self.device)  # move first: the views below must stay put
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
        self.shards = Shards(seed, self.source.train_size, workers, cfg.batch_size)
        self._heldout: tuple[torch.Tensor, torch.Tensor] | None = None
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

    def apply_update(self, grad: np.ndarray | torch.Tensor, optimizer: Any) -> None:
        g = torch.as_tensor(grad, device=self.device).to(torch.float32)
        with torch.no_grad():
            optimizer.step(self.flat, g)

    # ---- data
    def batch(self, worker: int, iteration: int) -> np.ndarray:
        return self.shards.batch(worker, iteration)

    def combine(self, batches: Sequence[np.ndarray]) -> np.ndarray:
        return self.shards.combine(list(batches))

    def _tensors(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.from_numpy(np.ascontiguousarray(x)).to(self.device)
        if self.flatten:
            x = x.reshape(len(x), -1)
        return x, torch.from_numpy(np.ascontiguousarray(y)).to(self.device)

    def _loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.language:  # (batch, T, vocab) against (batch, T): the mean over every token
            return self.loss_fn(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        return self.loss_fn(out, y)

    # ---- gradients
    def _forward_backward(self, batch: np.ndarray) -> tuple[float, int]:
        x, y = self._tensors(*self.source.train(batch))
        self.flat_grad.zero_()
        loss = self._loss(self.model(x), y)
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
        done = self.countdown(buckets, self.flat_grad, on_ready)
        handles = []

        def hook_for(tensor_index: int):
            return lambda _p: done(tensor_index)

        for i, p in enumerate(self.params):
            handles.append(p.register_post_accumulate_grad_hook(hook_for(i)))
        try:
            loss, samples = self._forward_backward(batch)
            return self.flat_grad, loss, samples
        finally:
            for h in handles:
                h.remove()

    # ---- evaluation
    def evaluate(self, flat: np.ndarray, samples: int) -> dict[str, float]:
        """Held-out mean loss and accuracy of the parameters `flat` (its first `samples`)."""
        self.set_params(flat)
        if self._heldout is None or len(self._heldout[0]) != samples:
            self._heldout = self._tensors(*self.source.heldout(samples))
        calibrate(self.model, self._tensors(*self.source.train(np.arange(min(CALIBRATION, self.source.train_size))))[0])
        x, y = self._heldout
        total, correct, count = 0.0, 0, 0
        self.model.eval()
        try:
            with torch.no_grad():
                for lo in range(0, len(x), EVAL_CHUNK):
                    out, target = self.model(x[lo:lo + EVAL_CHUNK]), y[lo:lo + EVAL_CHUNK]
                    n = target.numel()
                    total += float(self._loss(out, target)) * n
                    correct += int((out.argmax(dim=-1) == target).sum())
                    count += n
        finally:
            self.model.train()
        return {"loss": total / count, "acc": correct / count}
