"""`--workload profile:NAME`: the names the config accepts. The profiles themselves (tensors,
FLOPs) live in testbed.workloads.profiles; config sits below the workloads, so it reads their
table's names as data.
"""

from __future__ import annotations

from functools import cache
from typing import Any

WORKLOADS = ("mlp", "logreg", "resnet", "transformer", "synthetic")
PROFILE = "profile:"  # --workload profile:NAME: the synthetic workload shaped as a real model


@cache
def profile_names() -> tuple[str, ...]:
    """The real-model shapes `--workload profile:NAME` knows: the keys of
    testbed/workloads/profiles.json (read as data here; config sits below the workloads)."""
    import json
    from pathlib import Path

    table = Path(__file__).resolve().parent.parent / "workloads" / "profiles.json"
    return tuple(json.loads(table.read_text()))


def workload_check(value: Any) -> str | None:
    """--workload: a built-in workload or profile:NAME of a known profile (the fix otherwise)."""
    if value in WORKLOADS:
        return None
    if isinstance(value, str) and value.startswith(PROFILE) and value[len(PROFILE):] in profile_names():
        return None
    return (f"choose one of {', '.join(WORKLOADS)} or a real model's shape: "
            f"{', '.join(PROFILE + n for n in profile_names())}")
