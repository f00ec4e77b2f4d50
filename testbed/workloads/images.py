"""Images for the classifiers: generated prototypes (no download), or CIFAR-10 / MNIST files.

Generated ("prototype") images, learnable with a held-out split and nothing to download: each of
C classes has a seeded smooth random 3x32x32 pattern (noise low-passed to spatial frequencies of
at most 3 cycles per image, scaled to unit variance). Sample i of a split is, from its own seed:

    x_i = c_i * shift(P[y_i], d_i) + 0.8 * shift(P[z_i], e_i) + sigma * noise

its class's prototype circularly shifted by up to 4 pixels each way at a contrast c_i in
[0.7, 1.3], a weaker distractor of another class z_i shifted on its own, and pixel noise
(sigma = 3). Labels are uniform. Chance is 1/C; the default ResNet-8 with momentum SGD goes from
23% to about 75% held-out accuracy (4 classes) in 100-200 steps of a global batch of 128, and
creeps on from there: a curve, not a step, so time to a target accuracy separates strategies. Samples are made when a batch asks for them
(a few milliseconds for 32), so a worker holds no data set in memory and starts at once.

Files (`--data`, `testbed.config.datafiles`): pixels scaled to [0, 1] and standardised per
channel with the mean and standard deviation of the first 5000 training images.
Pure: numpy only.
"""

from __future__ import annotations

import numpy as np

SHAPE = (3, 32, 32)
MAX_FREQ = 3
MAX_SHIFT = 4
DISTRACTOR = 0.8
NOISE = 3.0
STATS_SAMPLES = 5000


def prototypes(seed: int, classes: int, shape: tuple[int, ...] = SHAPE) -> np.ndarray:
    """(classes, *shape) smooth seeded patterns, each with zero mean and unit variance."""
    rng = np.random.default_rng([seed, 17])
    raw = rng.standard_normal((classes, *shape))
    spec = np.fft.fft2(raw)
    fy = np.abs(np.fft.fftfreq(shape[1]) * shape[1])[:, None]
    fx = np.abs(np.fft.fftfreq(shape[2]) * shape[2])[None, :]
    spec *= (fy <= MAX_FREQ) & (fx <= MAX_FREQ)
    smooth = np.fft.ifft2(spec).real
    smooth -= smooth.mean(axis=(1, 2, 3), keepdims=True)
    smooth /= smooth.std(axis=(1, 2, 3), keepdims=True)
    return smooth.astype(np.float32)


class PrototypeImages:
    """Generated images (module docstring): `train(idx)` and `heldout(n)` give (x, y)."""

    def __init__(self, seed: int, classes: int, samples: int) -> None:
        self.seed, self.classes, self.train_size = seed, classes, samples
        self.protos = prototypes(seed, classes)
        self.shape = SHAPE

    def _make(self, idx: np.ndarray, split: int) -> tuple[np.ndarray, np.ndarray]:
        x = np.empty((len(idx), *SHAPE), np.float32)
        y = np.empty(len(idx), np.int64)
        for k, i in enumerate(idx):
            rng = np.random.default_rng([self.seed, 19, split, int(i)])
            label = int(rng.integers(self.classes))
            other = (label + 1 + int(rng.integers(self.classes - 1))) % self.classes
            d, e = rng.integers(-MAX_SHIFT, MAX_SHIFT + 1, size=(2, 2))
            img = rng.uniform(0.7, 1.3) * np.roll(self.protos[label], tuple(d), axis=(1, 2))
            img += DISTRACTOR * np.roll(self.protos[other], tuple(e), axis=(1, 2))
            img += NOISE * rng.standard_normal(SHAPE, dtype=np.float32)
            x[k], y[k] = img, label
        return x, y

    def train(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._make(idx, 0)

    def heldout(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        return self._make(np.arange(n), 1)


class FileImages:
    """CIFAR-10 or MNIST images from `--data` (module docstring)."""

    def __init__(self, path: str) -> None:
        from testbed.config.datafiles import load_images

        data = load_images(path)
        self.data, self.classes = data, data.classes
        self.train_size = len(data.train_y)
        self.shape = tuple(data.train_x.shape[1:])
        head = np.asarray(data.train_x[:STATS_SAMPLES], dtype=np.float32) / 255.0
        self.mean = head.mean(axis=(0, 2, 3)).reshape(1, -1, 1, 1).astype(np.float32)
        self.std = (head.std(axis=(0, 2, 3)).reshape(1, -1, 1, 1) + 1e-6).astype(np.float32)

    def _scale(self, raw: np.ndarray) -> np.ndarray:
        return ((np.asarray(raw, dtype=np.float32) / 255.0) - self.mean) / self.std

    def train(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._scale(self.data.train_x[idx]), np.asarray(self.data.train_y[idx])

    def heldout(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        n = min(n, len(self.data.test_y))
        return self._scale(self.data.test_x[:n]), np.asarray(self.data.test_y[:n])
