"""What injected faults do, the errors recovery is built on, and the one NaN/Inf policy.

The `--fail` grammar is `testbed.config.faultspec`. Each fault fires once, in the actor's first
incarnation: a restarted actor does not fire it again (otherwise a kill at iteration 10 would
kill every replacement at iteration 10 too).

`--on-nan skip|stop` is applied by `NanPolicy.admit` wherever gradients (or, for gossip,
parameters) are about to be applied: the driver (mapreduce), a PS shard, every ring peer,
every gossip peer. `skip` leaves the value out and the run records a `nan-skipped` fault;
`stop` raises `NonFiniteGradient`, which ends the run as diverged. Skipping is bounded: the
recorder counts the skipped gradients and stops the run as diverged past `--max-skipped`, so a
diverging model never spins forever. Pure; no Ray import.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from testbed.config.faultspec import Fault


class RestartsExhausted(RuntimeError):
    """An actor died more often than --max-restarts allows; the run stops (exit code 3)."""


class NonFiniteGradient(RuntimeError):
    """A NaN/Inf gradient arrived and --on-nan stop was asked for."""


class ServerLost(RuntimeError):
    """A PS shard died and no checkpoint can restore it; the run stops (exit code 3)."""


class Diverged(RuntimeError):
    """The model diverged: more non-finite gradients were skipped than --max-skipped allows (or
    --on-nan stop met one); the run stops with status "diverged" (exit code 4)."""


class FaultPlan:
    """What one actor must do to itself, and when (checked by the actor each iteration)."""

    def __init__(self, faults: tuple[Fault, ...], target: str, index: int, restarted: bool) -> None:
        self.mine = {} if restarted else {f.at: f.kind for f in faults
                                          if f.target == target and f.index == index}

    def due(self, at: int) -> str | None:
        """The fault kind to fire at this iteration/version, once."""
        return self.mine.pop(at, None)


def poison(grad):
    """Make a gradient non-finite (the injected NaN fault)."""
    grad[...] = math.nan
    return grad


def is_finite(values) -> bool:
    """True when every element is finite."""
    if type(values).__module__.startswith("torch"):  # a tensor (on any device)
        import torch

        return bool(torch.isfinite(values).all())
    return bool(np.isfinite(values).all())


class NanPolicy:
    """`--on-nan`: decide, before anything is applied, whether a value may be."""

    def __init__(self, on_nan: str) -> None:
        if on_nan not in ("skip", "stop"):
            raise ValueError(f"--on-nan {on_nan!r}: choose skip or stop")
        self.stop = on_nan == "stop"

    def admit(self, values, what: str) -> bool:
        """True if VALUES are finite; False to skip them; NonFiniteGradient under `stop`."""
        if is_finite(values):
            return True
        if self.stop:
            raise NonFiniteGradient(f"{what}: not finite (--on-nan stop)")
        return False


def not_reached(faults: Iterable[Fault], steps: Iterable[Mapping[str, Any]],
                updates: Iterable[Mapping[str, Any]], fired: Iterable[Mapping[str, Any]]) -> list[tuple[Fault, str]]:
    """The faults of a run that ended without reaching them, each with a line saying how far its
    target got: a worker fault whose worker recorded no iteration at or past `at` (an
    asynchronous worker makes only its share of --steps), a server fault while no version past
    `at` was applied -- and, either way, with no fault recorded of that actor at or past `at`.
    STEPS and UPDATES are the run's records, FIRED its recorded faults."""
    last: dict[int, int] = {}
    for row in steps:
        last[int(row["worker"])] = max(last.get(int(row["worker"]), -1), int(row["iteration"]))
    version = max((int(u["version"]) for u in updates), default=0)
    seen: dict[str, int] = {}
    for row in fired:
        seen[str(row["actor"])] = max(seen.get(str(row["actor"]), -1), int(row["iteration"]))
    out = []
    for f in faults:
        actor = f"worker{f.index}" if f.target == "worker" else f"ps{f.index}"
        if seen.get(actor, -1) >= f.at:
            continue
        if f.target == "worker" and last.get(f.index, -1) < f.at:
            got = last.get(f.index)
            far = "no iteration" if got is None else f"iterations 0..{got}"
            out.append((f, f"--fail {f.to_text()!r} never fired: worker {f.index} made {far} in this "
                           f"run; use a smaller at (an asynchronous worker makes about --steps / --workers)"))
        elif f.target == "server" and version <= f.at:
            out.append((f, f"--fail {f.to_text()!r} never fired: the run applied versions up to {version}; "
                           "use a smaller at"))
    return out
