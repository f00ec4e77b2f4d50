"""Real model shapes for the synthetic workload: `--workload profile:NAME`. Pure (no torch).

A profile is a named model's parameter tensors in registration order, each with its shape and
the backward FLOPs behind it (derived from the definitions in testbed.workloads.modelzoo, on
torch's meta device, into profiles.json). With a profile the synthetic workload's gradient is
laid out as those tensors (logical sizes exact; physical ones scaled by `--payload scaled:F`),
buckets form over them in reverse registration order as in DDP, and the backward part of
`--compute-ms` is spread over them in proportion to their backward FLOPs, so bucketing and
overlap behave as they would on that model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

TABLE = Path(__file__).resolve().parent / "profiles.json"
PREFIX = "profile:"


@dataclass(frozen=True)
class Profile:
    name: str
    params: int
    sample: str
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    backward_flops: tuple[float, ...]

    @property
    def numels(self) -> list[int]:
        out = []
        for shape in self.shapes:
            n = 1
            for d in shape:
                n *= d
            out.append(n)
        return out


@cache
def _table() -> dict:
    return json.loads(TABLE.read_text())


def names() -> tuple[str, ...]:
    """The profiles there are, as `--workload` values (profile:resnet50, ...)."""
    return tuple(PREFIX + name for name in _table())


@cache
def load_profile(name: str) -> Profile:
    """The profile NAME (without the prefix); KeyError if there is none."""
    entry = _table()[name]
    tensors = entry["tensors"]
    return Profile(name=name, params=int(entry["params"]), sample=entry["sample"],
                   names=tuple(t[0] for t in tensors), shapes=tuple(tuple(t[1]) for t in tensors),
                   backward_flops=tuple(float(t[2]) for t in tensors))
