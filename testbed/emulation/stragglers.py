"""Draw straggler delays reproducibly, and stretch a worker's compute by them.

The specs come from `--straggler` (`testbed.config.stragglerspec`). A worker iteration is slowed
in two ways that add up:

* additive delays (`fixed`, `random`, `sporadic`): seconds slept before the gradient leaves;
* `slowdown:worker=r,factor=f`: the worker's compute takes f times as long, i.e. every moment
  of its compute is moved later, so (f-1) x compute seconds in all.

`Stretch` applies both to one iteration of compute *as it happens*: each time a gradient piece
is ready (a bucket handed to the allreduce, or the whole gradient) it sleeps until the moment
that piece would be ready on the slow machine -- f times the real compute so far, plus the
additive delay. So overlap of communication with a slow backward behaves as on a slow worker,
and strategies that send the gradient once see (f-1) compute + additive before it leaves.

Every random draw comes from its own generator seeded with (seed, worker, iteration,
spec index): a delay depends neither on call order nor on which other delays were asked for.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from testbed.config.stragglerspec import (
    FixedDelay,
    Slowdown,
    SporadicDelay,
    StragglerSpec,
    parse_stragglers,
)

__all__ = ["StragglerModel", "Stretch"]


class StragglerModel:
    """Turn specs and a seed into a deterministic extra delay per (worker, iteration)."""

    def __init__(self, specs: tuple[StragglerSpec, ...] | str, seed: int, dilation: float = 1.0) -> None:
        self.specs = parse_stragglers(specs) if isinstance(specs, str) else tuple(specs)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed {seed!r}: must be an integer >= 0; e.g. 0")
        self.seed = seed
        self.dilation = dilation  # additive delays are slept D times longer (--dilation)

    def _rng(self, worker: int, iteration: int, index: int) -> np.random.Generator:
        # One generator per draw, keyed by what the draw is for: results do not depend
        # on call order, on other workers, or on which other iterations were queried.
        return np.random.default_rng([self.seed, worker, iteration, index])

    def factor(self, worker: int) -> float:
        """How many times longer WORKER's compute takes (product of its slowdowns; 1 = none)."""
        f = 1.0
        for spec in self.specs:
            if isinstance(spec, Slowdown) and spec.worker == worker:
                f *= spec.factor
        return f

    def additive(self, worker: int, iteration: int) -> float:
        """Seconds added to WORKER's ITERATION by the fixed, random and sporadic specs."""
        if worker < 0 or iteration < 0:
            raise ValueError(f"worker {worker}, iteration {iteration}: both must be >= 0")
        total = 0.0
        for index, spec in enumerate(self.specs):
            if isinstance(spec, FixedDelay):
                total += spec.delay if worker == spec.worker else 0.0
            elif isinstance(spec, Slowdown):
                continue
            elif isinstance(spec, SporadicDelay):
                hit = self._rng(worker, iteration, index).random() < spec.p
                total += spec.delay if hit else 0.0
            elif spec.dist == "lognormal":
                # LogNormal(0, sigma) has median 1, so scale is the typical delay.
                total += spec.scale * self._rng(worker, iteration, index).lognormal(0.0, spec.sigma)
            else:
                total += self._rng(worker, iteration, index).exponential(spec.mean)
        return total

    def delay(self, worker: int, iteration: int, compute_s: float = 0.0) -> float:
        """Return the extra seconds WORKER sleeps at ITERATION after COMPUTE_S of real work."""
        if not (math.isfinite(compute_s) and compute_s >= 0):
            raise ValueError(f"compute_s {compute_s!r}: must be finite and >= 0 seconds")
        return self.additive(worker, iteration) + (self.factor(worker) - 1.0) * compute_s

    def stretch(self, worker: int, iteration: int, *, clock: Callable[[], float] = time.perf_counter,
                sleep: Callable[[float], None] = time.sleep) -> Stretch:
        return Stretch(self.factor(worker), self.additive(worker, iteration) * self.dilation, clock, sleep)


class Stretch:
    """One iteration's compute on a slow worker: call `ready()` whenever a piece of the gradient
    is done (the last call at the end of compute); it sleeps until that piece would be done.

    Real compute so far c (the clock since start, minus what was slept): the piece is due at
    start + f c + additive. Records take `compute_s` (real work) and `injected_s` (the delay
asked for); `slept_s` is what the sleeps really took.
    """

    def __init__(self, factor: float, additive: float, clock: Callable[[], float],
                 sleep: Callable[[float], None]) -> None:
        self.factor, self.additive = factor, additive
        self.clock, self._sleep = clock, sleep
        self.t0 = clock()
        self.slept_s = 0.0
        self.compute_s = 0.0

    @property
    def injected_s(self) -> float:
        """The delay asked for: (f-1) x real compute + additive (what was slept, less jitter)."""
        return (self.factor - 1.0) * self.compute_s + self.additive

    @property
    def active(self) -> bool:
        return self.factor != 1.0 or self.additive > 0.0

    def ready(self) -> None:
        now = self.clock()
        self.compute_s = max(0.0, now - self.t0 - self.slept_s)
        if not self.active:
            return
        due = self.t0 + self.factor * self.compute_s + self.additive
        if due > now:
            self._sleep(due - now)
            self.slept_s += self.clock() - now
