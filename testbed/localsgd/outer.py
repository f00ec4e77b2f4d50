"""The round of local SGD: when replicas are averaged, and the outer step that follows. Pure numpy.

Local SGD (Stich 2019; "post-local SGD", Lin et al. 2020) lets every worker take H steps of its
own optimizer on its own batches, then averages the replicas. DiLoCo (Douillard et al. 2023)
keeps the round and treats the replicas' mean change as an outer gradient:

    anchor  the parameters every replica started the round from
    g       anchor - mean(replicas)                        (the outer gradient)
    m       mu m + g                                       (momentum buffer, 0 at the start)
    anchor  anchor - lr_out (g + mu m)                     (Nesterov, as torch's SGD nesterov=True)

and every replica starts the next round from the new anchor. `average` is the plain local SGD
step, anchor = mean(replicas) (the Nesterov step at lr_out = 1, mu = 0). With H = 1 and `average`
a round is one step of synchronous SGD: each replica takes p - lr g_i, and their mean is
p - lr mean(g_i), the ring's step (for SGD and momentum, whose state is linear in the gradients).

Rounds: iteration t (0-based) ends a round when t + 1 is a multiple of H, and the run's last
iteration always ends one, so the final parameters are an average whatever --steps is.
"""

from __future__ import annotations

import numpy as np


def ends_round(iteration: int, local_steps: int, steps: int) -> bool:
    """True when the replicas are averaged after `iteration` (0-based) of a run of `steps`."""
    return (iteration + 1) % local_steps == 0 or iteration + 1 == steps


def rounds(local_steps: int, steps: int) -> int:
    """How many averages a run of `steps` iterations makes."""
    return sum(ends_round(t, local_steps, steps) for t in range(steps))


class OuterStep:
    """The outer optimizer of one replica: every replica holds one and, fed the same mean, takes
    the same step, so the replicas start every round identical."""

    def __init__(self, kind: str, lr: float, momentum: float) -> None:
        self.kind, self.lr, self.momentum = kind, lr, momentum
        self.buffer: np.ndarray | None = None

    def step(self, anchor: np.ndarray, mean: np.ndarray) -> np.ndarray:
        """The next round's start, from this round's start and the replicas' mean."""
        if self.kind == "average":
            return mean.astype(np.float32, copy=True)
        g = anchor - mean
        self.buffer = g.copy() if self.buffer is None else self.momentum * self.buffer + g
        return (anchor - self.lr * (g + self.momentum * self.buffer)).astype(np.float32)
