"""Deterministic synthetic classification data, the data source of a workload, and per-worker
shards (numpy only).

Data: C Gaussian blobs in D dimensions with seeded means, so the Bayes-optimal classifier is
linear and the loss has a known floor; the held-out split is drawn from the same blobs with a
seed of its own. Worker r owns the disjoint shard perm[r::N] of a seeded permutation of the
training samples; its iteration i batch is a slice of an epoch-seeded shuffle of that shard.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def make_dataset(seed: int, samples: int, features: int, classes: int,
                 heldout: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of the training split, or of the held-out split (the same blobs, other draws)."""
    rng = np.random.default_rng([seed, 7])
    means = rng.normal(scale=1.5, size=(classes, features))
    if heldout:
        rng = np.random.default_rng([seed, 8])
    y = rng.integers(classes, size=samples)
    x = means[y] + rng.normal(size=(samples, features))
    return x.astype(np.float32), y.astype(np.int64)


class Blobs:
    """The Gaussian blobs as a data source: `train(idx)` and `heldout(n)` give (x, y)."""

    def __init__(self, seed: int, samples: int, features: int, classes: int) -> None:
        self.seed, self.features, self.classes, self.train_size = seed, features, classes, samples
        self.x, self.y = make_dataset(seed, samples, features, classes)
        self.shape = (features,)

    def train(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.x[idx], self.y[idx]

    def heldout(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        return make_dataset(self.seed, n, self.features, self.classes, heldout=True)


def shard_indices(seed: int, samples: int, workers: int, worker: int) -> np.ndarray:
    perm = np.random.default_rng([seed, 11]).permutation(samples)
    return perm[worker::workers]


def batch_indices(seed: int, shard: np.ndarray, worker: int, iteration: int, batch: int) -> np.ndarray:
    """Indices of worker's batch at iteration: epoch-reshuffled, wrapping if the shard is small."""
    m = len(shard)
    per_epoch = max(1, m // batch)
    epoch, pos = divmod(iteration, per_epoch)
    order = np.random.default_rng([seed, 13, worker, epoch]).permutation(m)
    take = np.arange(pos * batch, pos * batch + batch) % m
    return shard[order[take]]


def make_source(cfg: Any, seed: int) -> Any:
    """The data a workload trains on: `train(idx)`, `heldout(n)`, `train_size` (and its shape,
    classes or vocabulary), all numpy."""
    if cfg.name == "transformer":
        from testbed.workloads.language import MarkovLanguage, TextCharacters

        if cfg.data is not None:
            return TextCharacters(cfg.data, cfg.seq_len)
        return MarkovLanguage(seed, cfg.vocab, cfg.seq_len, cfg.samples)
    if cfg.data is not None:
        from testbed.workloads.images import FileImages

        return FileImages(cfg.data)
    if cfg.name == "resnet":
        from testbed.workloads.images import PrototypeImages

        return PrototypeImages(seed, cfg.classes, cfg.samples)
    return Blobs(seed, cfg.samples, cfg.features, cfg.classes)


class Shards:
    """Worker r's batches: the disjoint shard r of the training samples, epoch-reshuffled
    (`shard_indices`, `batch_indices`), and the global batch of a step (their concatenation)."""

    def __init__(self, seed: int, samples: int, workers: int, batch: int) -> None:
        self.seed, self.samples, self.workers, self.size = seed, samples, workers, batch
        self._shards: dict[int, np.ndarray] = {}

    def batch(self, worker: int, iteration: int) -> np.ndarray:
        if worker not in self._shards:
            self._shards[worker] = shard_indices(self.seed, self.samples, self.workers, worker)
        return batch_indices(self.seed, self._shards[worker], worker, iteration, self.size)

    @staticmethod
    def combine(batches: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(list(batches))
