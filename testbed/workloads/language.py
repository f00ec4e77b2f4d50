"""Token sequences for the language model: a seeded synthetic language whose best achievable loss
is known exactly, or the characters of a text file.

The synthetic language is an order-2 Markov chain over V tokens. Each context (a, b) -- the two
tokens before -- has K = 3 likely successors (seeded, Dirichlet(1) weights) that share 1 - eps
of the probability, and every token gets eps / V on top (eps = 0.05), so the chain is ergodic:

    P(c | a, b) = (1 - eps) w_ab(c) + eps / V

Sequences start from the stationary distribution pi of the pair chain (a, b) -> (b, c), so every
position is distributed alike. A model that sees the whole context can do no better than the
chain's own conditionals; its expected cross-entropy (nats per token) over the T targets of a
sequence x_0 .. x_T (inputs x_0 .. x_{T-1}) is exactly

    L* = (H(X_1 | X_0) + (T - 1) H) / T,   H = sum_ab pi(a, b) H(P(. | a, b))

(the first target has one token of context: H(X_1 | X_0) = H(pi) - H(marginal of pi); every later
one has two, and the entropy rate H is what an order-2 chain leaves). `optimum` is L*, reported
beside the measured held-out loss; a unigram model stops at H(marginal), a bigram one at
H(X_1 | X_0), so the gap between them says how much context a model has learnt to use.

Text files (`--data`): character ids; a training sample is a window of T + 1 characters starting
at a multiple of T, held-out windows likewise in the last tenth of the file. Pure: numpy only.
"""

from __future__ import annotations

import numpy as np

SUCCESSORS = 3
EPS = 0.05


def _entropy(p: np.ndarray, axis: int = -1) -> np.ndarray:
    safe = np.where(p > 0, p, 1.0)
    return -(p * np.log(safe)).sum(axis=axis)


class MarkovLanguage:
    """The synthetic language (module docstring): `train(idx)` and `heldout(n)` give (x, y)."""

    def __init__(self, seed: int, vocab: int, seq_len: int, samples: int) -> None:
        self.seed, self.vocab, self.seq_len, self.train_size = seed, vocab, seq_len, samples
        rng = np.random.default_rng([seed, 29])
        v, k = vocab, min(SUCCESSORS, vocab)
        succ = np.argsort(rng.random((v, v, v)), axis=2)[:, :, :k]  # K distinct successors per context
        weights = np.zeros((v, v, v))
        np.put_along_axis(weights, succ, rng.dirichlet(np.ones(k), size=(v, v)), axis=2)
        self.P = (1 - EPS) * weights + EPS / v  # P[a, b, c] = P(c | a, b)
        self.cdf = np.cumsum(self.P, axis=2)
        self.pi = self._stationary()
        self.pair_cdf = np.cumsum(self.pi.ravel())

    def _stationary(self) -> np.ndarray:
        """pi(a, b) of the pair chain, by power iteration (eps mixing makes it converge fast)."""
        v = self.vocab
        pi = np.full((v, v), 1.0 / v**2)
        for _ in range(10_000):
            nxt = np.einsum("ab,abc->bc", pi, self.P)
            if np.abs(nxt - pi).sum() < 1e-13:
                return nxt
            pi = nxt
        return pi

    @property
    def entropy_rate(self) -> float:
        return float((self.pi * _entropy(self.P)).sum())

    @property
    def first_conditional_entropy(self) -> float:
        """H(X_1 | X_0) under the stationary pair distribution."""
        return float(_entropy(self.pi.ravel()) - _entropy(self.pi.sum(axis=1)))

    @property
    def optimum(self) -> float:
        t = self.seq_len
        return (self.first_conditional_entropy + (t - 1) * self.entropy_rate) / t

    def sequences(self, idx: np.ndarray, split: int) -> np.ndarray:
        """(n, T + 1) tokens, each row from its own seed (split 0: training, 1: held-out)."""
        t, v = self.seq_len, self.vocab
        u = np.stack([np.random.default_rng([self.seed, 31, split, int(i)]).random(t) for i in idx])
        seq = np.empty((len(idx), t + 1), np.int64)
        pair = np.minimum(np.searchsorted(self.pair_cdf, u[:, 0], side="right"), v * v - 1)
        seq[:, 0], seq[:, 1] = np.divmod(pair, v)
        for j in range(2, t + 1):
            cdf = self.cdf[seq[:, j - 2], seq[:, j - 1]]
            seq[:, j] = np.minimum((cdf <= u[:, j - 1, None]).sum(axis=1), v - 1)
        return seq

    def train(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        seq = self.sequences(idx, 0)
        return seq[:, :-1], seq[:, 1:]

    def heldout(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        seq = self.sequences(np.arange(n), 1)
        return seq[:, :-1], seq[:, 1:]


class TextCharacters:
    """A text file's characters (module docstring)."""

    optimum = None

    def __init__(self, path: str, seq_len: int) -> None:
        from testbed.config.datafiles import load_text

        text = load_text(path)
        self.text, self.seq_len, self.vocab = text, seq_len, len(text.chars)
        self.train_size = max(1, (len(text.train) - 1) // seq_len)

    def _windows(self, ids: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = self.seq_len
        starts = np.minimum(np.asarray(idx) * t, len(ids) - t - 1)
        seq = ids[starts[:, None] + np.arange(t + 1)[None, :]]
        return seq[:, :-1], seq[:, 1:]

    def train(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._windows(self.text.train, idx)

    def heldout(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        count = max(1, (len(self.text.test) - 1) // self.seq_len)
        return self._windows(self.text.test, np.arange(min(n, count)))
