"""Deterministic synthetic classification data and per-worker shards (numpy only).

Data: C Gaussian blobs in D dimensions with seeded means, so the Bayes-optimal classifier is
linear and the loss has a known floor. Worker r owns the disjoint shard perm[r::N] of a seeded
permutation; its iteration i batch is a slice of an epoch-seeded shuffle of that shard.
"""

from __future__ import annotations

import numpy as np


def make_dataset(seed: int, samples: int, features: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, 7])
    means = rng.normal(scale=1.5, size=(classes, features))
    y = rng.integers(classes, size=samples)
    x = means[y] + rng.normal(size=(samples, features))
    return x.astype(np.float32), y.astype(np.int64)


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
