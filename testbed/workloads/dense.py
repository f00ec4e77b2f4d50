"""`mlp` and `logreg` on the CPU in numpy, backward written out: real compute without torch.

Why not torch: these two are the small real models (the default workload, most tests), and an
actor process that imports torch takes about 1 s of CPU more to start (3-4 s on a slow core) and
150 MiB more memory. Their two layers are a few lines of numpy. The same networks in torch
(`nets.classifier`) stay the reference this module is tested against
(tests/unit/test_dense.py: same layout, same gradient to float32 rounding) and the
implementation for `--device cuda`.

    mlp     x (B, D) -> z = x W0^T + b0 (B, H) -> h = relu(z) -> y = h W2^T + b2 (B, C)
    logreg  x (B, D) -> y = x W^T + b (B, C)
    loss    mean over the batch of  logsumexp(y) - y[label]

    backward (the chain rule, last layer first):
        dy  = (softmax(y) - onehot(label)) / B
        dW2 = dy^T h        db2 = sum_B dy          dh = dy W2
        dz  = dh * [z > 0]
        dW0 = dz^T x        db0 = sum_B dz

Parameters are named and shaped as torch's `nn.Sequential(Linear, ReLU, Linear)` names them
("0.weight" (H, D), "0.bias", "2.weight" (C, H), "2.bias"; logreg "weight", "bias") and laid out
in that order in one flat float32 vector; each layer's arrays are views into it, as are the
gradient's. Initialisation is torch's for `nn.Linear` (weights and biases uniform in
+-1/sqrt(fan_in)), drawn from a numpy generator seeded by --seed, so every replica starts
identical. Backward hands out a bucket (`gradient_buckets`) the moment its last tensor's
gradient is written, last layer first, as torch's post-accumulate hooks would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from testbed.config import WorkloadConfig
from testbed.workloads.base import Workload
from testbed.workloads.data import Shards, make_source

EVAL_CHUNK = 4096  # held-out samples per forward pass


def layout_of(name: str, features: int, hidden: int, classes: int) -> list[tuple[str, tuple[int, ...]]]:
    if name == "logreg":
        return [("weight", (classes, features)), ("bias", (classes,))]
    return [("0.weight", (hidden, features)), ("0.bias", (hidden,)),
            ("2.weight", (classes, hidden)), ("2.bias", (classes,))]


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy of a batch and softmax(logits) (computed stably, in float64 sums)."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    total = exp.sum(axis=1, keepdims=True)
    loss = float(np.mean(np.log(total[:, 0]) - shifted[np.arange(len(labels)), labels]))
    return loss, exp / total


class DenseWorkload(Workload):
    """mlp / logreg replica (module docstring)."""

    def __init__(self, cfg: WorkloadConfig, *, seed: int, workers: int) -> None:
        self.cfg, self.seed, self.workers = cfg, seed, workers
        self.source = make_source(cfg, seed)
        self.optimum = getattr(self.source, "optimum", None)
        features = int(np.prod(self.source.shape))  # an image is its pixels in a row
        self.layout = layout_of(cfg.name, features, cfg.hidden, self.source.classes)
        sizes = [int(np.prod(shape)) for _, shape in self.layout]
        self.numel = sum(sizes)
        self.logical_bytes = self.numel * 4
        self.flat = np.zeros(self.numel, dtype=np.float32)
        self.flat_grad = np.zeros(self.numel, dtype=np.float32)
        rng = np.random.default_rng([seed, 17])
        self.w: list[np.ndarray] = []  # views into flat, layout order
        self.g: list[np.ndarray] = []  # the same views into flat_grad
        for sl, (_, shape) in zip(self.slices(), self.layout, strict=True):
            self.w.append(self.flat[sl].reshape(shape))
            self.g.append(self.flat_grad[sl].reshape(shape))
        for i in range(0, len(self.w), 2):  # (weight, bias) per layer; fan_in = weight's columns
            bound = 1.0 / np.sqrt(self.w[i].shape[1])
            for arr in (self.w[i], self.w[i + 1]):
                arr[...] = rng.uniform(-bound, bound, size=arr.shape).astype(np.float32)
        self.shards = Shards(seed, self.source.train_size, workers, cfg.batch_size)
        self._heldout: tuple[np.ndarray, np.ndarray] | None = None

    # ---- parameters
    def get_params(self) -> np.ndarray:
        return self.flat.copy()

    def set_params(self, flat: np.ndarray) -> None:
        self.flat[...] = np.asarray(flat, dtype=np.float32)

    def apply_update(self, grad: Any, optimizer: Any) -> None:
        optimizer.step(self.flat, np.asarray(grad, dtype=np.float32))  # in place: the views follow

    # ---- data
    def batch(self, worker: int, iteration: int) -> np.ndarray:
        return self.shards.batch(worker, iteration)

    def combine(self, batches: Sequence[np.ndarray]) -> np.ndarray:
        return self.shards.combine(list(batches))

    def _inputs(self, x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x, dtype=np.float32).reshape(len(x), -1)

    # ---- forward and backward
    def forward(self, x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """Logits, and each layer's input (what backward needs)."""
        inputs, a = [], x
        layers = len(self.w) // 2
        for k in range(layers):
            inputs.append(a)
            z = a @ self.w[2 * k].T + self.w[2 * k + 1]
            a = np.maximum(z, 0.0) if k < layers - 1 else z
        return a, inputs

    def _backward(self, batch: np.ndarray, done: Callable[[int], None]) -> tuple[float, int]:
        x, y = self.source.train(batch)
        x, y = self._inputs(x), np.asarray(y)
        logits, inputs = self.forward(x)
        loss, prob = cross_entropy(logits, y)
        d = prob
        d[np.arange(len(y)), y] -= 1.0
        d = (d / np.float32(len(y))).astype(np.float32)
        for k in reversed(range(len(self.w) // 2)):
            a = inputs[k]
            np.matmul(d.T, a, out=self.g[2 * k])
            done(2 * k)
            np.sum(d, axis=0, out=self.g[2 * k + 1])
            done(2 * k + 1)
            if k > 0:  # through the ReLU: its output a is positive exactly where z was
                d = (d @ self.w[2 * k]) * (a > 0)
        return loss, len(y)

    def gradient(self, batch: np.ndarray) -> tuple[np.ndarray, float, int]:
        loss, samples = self._backward(batch, lambda _i: None)
        return self.flat_grad.copy(), loss, samples

    def gradient_buckets(
        self, batch: np.ndarray, buckets: list[list[int]], on_ready: Callable[[int, np.ndarray], None]
    ) -> tuple[np.ndarray, float, int]:
        """Backward that hands a bucket out once its last tensor's gradient is written."""
        done = self.countdown(buckets, self.flat_grad, on_ready)
        loss, samples = self._backward(batch, done)
        return self.flat_grad, loss, samples

    # ---- evaluation
    def evaluate(self, flat: np.ndarray, samples: int) -> dict[str, float]:
        """Held-out mean loss and accuracy of the parameters `flat` (its first `samples`)."""
        self.set_params(flat)
        if self._heldout is None or len(self._heldout[0]) != samples:
            x, y = self.source.heldout(samples)
            self._heldout = self._inputs(x), np.asarray(y)
        x, y = self._heldout
        total, correct = 0.0, 0
        for lo in range(0, len(x), EVAL_CHUNK):
            logits, _ = self.forward(x[lo:lo + EVAL_CHUNK])
            target = y[lo:lo + EVAL_CHUNK]
            loss, _ = cross_entropy(logits, target)
            total += loss * len(target)
            correct += int((logits.argmax(axis=1) == target).sum())
        return {"loss": total / len(y), "acc": correct / len(y)}
