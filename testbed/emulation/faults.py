"""Fault injection (`--fail SPEC`) and the errors recovery is built on. Pure; no Ray import.

SPEC is one or more items joined by ';':
    worker=2,at=10         kill worker 2's process at its iteration 10
    server=0,at=20         kill PS shard 0 when it is about to apply version 20
    hang:worker=1,at=5     worker 1 stops answering at its iteration 5 (treated as dead)
    nan:worker=3,at=7      worker 3 returns a NaN gradient at its iteration 7

Each fault fires once, in the actor's first incarnation: a restarted actor does not fire it
again (otherwise a kill at iteration 10 would kill every replacement at iteration 10 too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

KINDS = ("kill", "hang", "nan")


class RestartsExhausted(RuntimeError):
    """An actor died more often than --max-restarts allows; the run stops (exit code 3)."""


class NonFiniteGradient(RuntimeError):
    """A NaN/Inf gradient arrived and --on-nan stop was asked for."""


class ServerLost(RuntimeError):
    """A PS shard died and no checkpoint can restore it; the run stops (exit code 3)."""


@dataclass(frozen=True)
class Fault:
    kind: str  # kill / hang / nan
    target: str  # worker / server
    index: int
    at: int

    def to_text(self) -> str:
        head = "" if self.kind == "kill" else f"{self.kind}:"
        return f"{head}{self.target}={self.index},at={self.at}"


def _bad(item: str, why: str) -> ValueError:
    return ValueError(f"--fail {item!r}: {why}; e.g. worker=2,at=10 or hang:worker=1,at=5")


def _parse_item(item: str) -> Fault:
    kind, sep, rest = item.partition(":")
    if not sep:
        kind, rest = "kill", item
    if kind not in KINDS:
        raise _bad(item, f"unknown fault kind {kind!r} (use kill, hang or nan)")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        key, eq, value = part.strip().partition("=")
        if not eq or key in fields:
            raise _bad(item, f"expected key=value pairs, got {part.strip()!r}")
        fields[key] = value
    targets = [k for k in ("worker", "server") if k in fields]
    if len(targets) != 1 or set(fields) != {targets[0], "at"}:
        raise _bad(item, "name exactly one of worker=N or server=N, and at=ITERATION")
    if kind != "kill" and targets[0] == "server":
        raise _bad(item, f"{kind} faults apply to workers only")
    try:
        index, at = int(fields[targets[0]]), int(fields["at"])
    except ValueError:
        raise _bad(item, "worker/server and at must be integers") from None
    if index < 0 or at < 0:
        raise _bad(item, "indices and iterations are >= 0")
    return Fault(kind, targets[0], index, at)


def parse_faults(text: str) -> tuple[Fault, ...]:
    """Parse --fail; 'none' or '' means no faults."""
    text = (text or "").strip()
    if text in ("", "none"):
        return ()
    return tuple(_parse_item(item.strip()) for item in text.split(";") if item.strip())


def validate_faults(faults: tuple[Fault, ...], *, workers: int, shards: int, ps: bool) -> None:
    for f in faults:
        if f.target == "worker" and f.index >= workers:
            raise ValueError(f"--fail {f.to_text()!r}: there is no worker {f.index}; "
                             f"use a worker in 0..{workers - 1}")
        if f.target == "server" and not ps:
            raise ValueError(f"--fail {f.to_text()!r}: only parameter-server strategies have servers")
        if f.target == "server" and f.index >= shards:
            raise ValueError(f"--fail {f.to_text()!r}: there is no shard {f.index}; "
                             f"use a shard in 0..{shards - 1}")


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


def is_finite(grad) -> bool:
    """True when every element is finite (checked before any gradient is applied)."""
    import numpy as np

    return bool(np.isfinite(grad).all())
