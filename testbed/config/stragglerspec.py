"""`--straggler SPEC`: the grammar and the typed specs (testbed.emulation.stragglers draws the delays).

``--straggler SPEC``: one or more items joined by ``;`` (or ``+``); their delays add up.

* ``none`` -- no extra delay (an empty tuple of specs).
* ``fixed:worker=3,delay=200ms`` -- worker 3 sleeps ``delay`` extra every iteration.
* ``slowdown:worker=3,factor=2.5`` -- worker 3's compute takes ``factor`` times as long,
  i.e. extra delay ``(factor - 1) * compute_s``; ``factor >= 1``.
* ``random:dist=lognormal,sigma=0.5[,scale=10ms]`` -- every worker, every iteration,
  extra delay ``scale * LogNormal(0, sigma)``; ``scale`` defaults to 10ms.
* ``random:dist=exponential[,mean=10ms]`` -- extra delay ``Exponential(mean)``.
* ``sporadic:p=0.05,delay=500ms`` -- each worker iteration independently, with
  probability ``p``, sleeps ``delay`` extra.

Durations take the units of ``testbed.util.units.parse_duration``. Every random draw comes from
its own generator seeded with ``(seed, worker, iteration, spec_index)``, so a delay does
not depend on which other delays were asked for, or in which order.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import ClassVar

from testbed.config.items import Items
from testbed.util.units import parse_duration

__all__ = [
    "FixedDelay",
    "RandomDelay",
    "Slowdown",
    "SporadicDelay",
    "StragglerSpec",
    "format_stragglers",
    "parse_stragglers",
    "validate_stragglers",
]

_FLAG = "--straggler"
_EXAMPLES = "e.g. none, fixed:worker=3,delay=200ms, sporadic:p=0.05,delay=500ms"


def _s(seconds: float) -> str:
    # repr() is the shortest text that parses back to the same float: exact round trip.
    return f"{seconds!r}s"


@dataclass(frozen=True)
class FixedDelay:
    """Add DELAY seconds to WORKER every iteration."""

    worker: int
    delay: float
    kind: ClassVar[str] = "fixed"

    def to_text(self) -> str:
        return f"fixed:worker={self.worker},delay={_s(self.delay)}"


@dataclass(frozen=True)
class Slowdown:
    """Stretch WORKER's compute by FACTOR."""

    worker: int
    factor: float
    kind: ClassVar[str] = "slowdown"

    def to_text(self) -> str:
        return f"slowdown:worker={self.worker},factor={self.factor!r}"


@dataclass(frozen=True)
class RandomDelay:
    """Add a random delay to every worker iteration (lognormal or exponential)."""

    dist: str
    sigma: float = 0.0  # lognormal only
    scale: float = 0.01  # lognormal only, seconds
    mean: float = 0.01  # exponential only, seconds
    kind: ClassVar[str] = "random"

    def to_text(self) -> str:
        if self.dist == "lognormal":
            return f"random:dist=lognormal,sigma={self.sigma!r},scale={_s(self.scale)}"
        return f"random:dist=exponential,mean={_s(self.mean)}"


@dataclass(frozen=True)
class SporadicDelay:
    """Add DELAY to each worker iteration with probability P."""

    p: float
    delay: float
    kind: ClassVar[str] = "sporadic"

    def to_text(self) -> str:
        return f"sporadic:p={self.p!r},delay={_s(self.delay)}"


StragglerSpec = FixedDelay | Slowdown | RandomDelay | SporadicDelay

# kind -> (required keys, optional keys)
_KEYS = {
    "fixed": ({"worker", "delay"}, set()),
    "slowdown": ({"worker", "factor"}, set()),
    "random": ({"dist"}, {"sigma", "scale", "mean"}),
    "sporadic": ({"p", "delay"}, set()),
}
_DIST_KEYS = {"lognormal": ({"sigma"}, {"scale"}), "exponential": (set(), {"mean"})}


def _bad(item: str, reason: str) -> ValueError:
    return ValueError(f"{_FLAG} {item!r}: {reason}; {_EXAMPLES}")


def _keys(item: str, given: set[str], required: set[str], optional: set[str]) -> None:
    unknown = sorted(given - required - optional)
    if unknown:
        allowed = ", ".join(sorted(required | optional))
        raise _bad(item, f"unknown key {unknown[0]!r}, expected {allowed}")
    missing = sorted(required - given)
    if missing:
        raise _bad(item, f"missing key {missing[0]!r}")


def _number(item: str, key: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _bad(item, f"{key}={text!r} is not a number") from None
    if not math.isfinite(value):
        raise _bad(item, f"{key}={text!r} must be finite")
    return value


def _worker(item: str, text: str) -> int:
    if not re.fullmatch(r"\d+", text.strip()):
        raise _bad(item, f"worker={text!r} must be an integer >= 0")
    return int(text)


def _duration(item: str, key: str, text: str) -> float:
    # parse_duration already rejects negatives, NaN and unknown units in one line.
    return parse_duration(text, flag=f"{_FLAG} {item!r}: {key}")


def _parse_item(item: str) -> StragglerSpec | None:
    kind, _, rest = item.partition(":")
    kind = kind.strip().lower()
    if kind == "none" and not rest.strip():
        return None
    if kind not in _KEYS:
        raise _bad(item, f"unknown kind {kind!r}, expected none, {', '.join(_KEYS)}")
    args: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = pair.partition("=")
        key = key.strip().lower()
        if not eq or not key or not value.strip():
            raise _bad(item, f"{pair!r} is not key=value")
        if key in args:
            raise _bad(item, f"key {key!r} given twice")
        args[key] = value.strip()
    _keys(item, set(args), *_KEYS[kind])
    if kind == "fixed":
        return FixedDelay(_worker(item, args["worker"]), _duration(item, "delay", args["delay"]))
    if kind == "slowdown":
        factor = _number(item, "factor", args["factor"])
        if factor < 1:
            raise _bad(item, f"factor={args['factor']!r} must be >= 1 (1 = no slowdown)")
        return Slowdown(_worker(item, args["worker"]), factor)
    if kind == "sporadic":
        p = _number(item, "p", args["p"])
        if not 0 <= p <= 1:
            raise _bad(item, f"p={args['p']!r} must be a probability in [0, 1]")
        return SporadicDelay(p, _duration(item, "delay", args["delay"]))
    dist = args.pop("dist").lower()
    if dist not in _DIST_KEYS:
        raise _bad(item, f"dist={dist!r} is unknown, expected {', '.join(_DIST_KEYS)}")
    _keys(item, set(args), *_DIST_KEYS[dist])
    if dist == "exponential":
        return RandomDelay(dist, mean=_duration(item, "mean", args.get("mean", "10ms")))
    sigma = _number(item, "sigma", args["sigma"])
    if sigma < 0:
        raise _bad(item, f"sigma={args['sigma']!r} must be >= 0")
    return RandomDelay(dist, sigma=sigma, scale=_duration(item, "scale", args.get("scale", "10ms")))


def parse_stragglers(text: str) -> tuple[StragglerSpec, ...]:
    """Parse a --straggler value into specs; 'none' gives ()."""
    if not isinstance(text, str) or not text.strip():
        raise _bad(str(text), "is empty, use 'none' for no stragglers")
    # Split on '+' only before a kind name, so exponents such as '1e+3ms' stay intact.
    items = [i.strip() for i in re.split(r";|\+(?=\s*[A-Za-z])", text)]
    if any(not i for i in items):
        raise _bad(text, "has an empty item between separators")
    return tuple(spec for spec in map(_parse_item, items) if spec is not None)


def format_stragglers(specs: tuple[StragglerSpec, ...]) -> str:
    """Return the --straggler text for SPECS ('none' when empty)."""
    return ";".join(spec.to_text() for spec in specs) or "none"


def validate_stragglers(specs: tuple[StragglerSpec, ...], workers: int) -> None:
    """Raise ValueError if a spec names a worker that does not exist."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers {workers!r}: must be an integer >= 1; e.g. 8")
    for spec in specs:
        worker = getattr(spec, "worker", None)
        if worker is not None and not 0 <= worker < workers:
            raise ValueError(
                f"{_FLAG} {spec.to_text()!r}: worker must be in 0..{workers - 1} "
                f"(there are {workers} workers)"
            )


@dataclass(frozen=True)
class Stragglers(Items):
    """Parsed `--straggler` items."""

    items: tuple[StragglerSpec, ...] = ()
    render = staticmethod(format_stragglers)


def parse_stragglers_spec(text: str) -> Stragglers:
    return Stragglers(parse_stragglers(text), text)
