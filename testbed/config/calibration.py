"""A real network's alpha and beta, measured: the calibration file. Pure (no Ray, no torch).

`python -m testbed.bench network --out FILE` measures, between two actors, the one-way time t(s)
of a message of s bytes over each message path the strategies use, at several sizes, and fits
the alpha-beta line through the medians (least squares):

    t(s) = alpha + s / B        alpha: latency per message (s), B: bandwidth (bytes/s)

`--calibration FILE` gives a real-network run the cost model's times with the alpha and B of
the path its strategy's messages take (`StrategySpec.message_path`):

    channel  a shared-memory Ray channel between neighbours (the ring's object-store transport)
    call     an actor call whose argument travels through the object store (parameter-server
             pushes and pulls, MapReduce, gossip, the any-pair allreduce algorithms)
    torch    torch.distributed point-to-point (the ring's torch transport)

File format (JSON): {"schema_version": 1, "kind": "testbed-calibration", "created", "scope",
"provenance", "paths": {PATH: {"alpha_s", "bandwidth_Bps", "sizes_bytes", "one_way_s",
"one_way_s_p10", "one_way_s_p90", "samples"}}, "inter_node": {"scope", "paths": {...}}};
`paths` were measured between two actors on one node (`scope` names it), `inter_node` (present
when the cluster has two nodes or more) between actors on two different nodes. A run whose
actors span nodes is predicted with the inter-node link.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
KIND = "testbed-calibration"
PATHS = ("channel", "call", "torch")
MEASURE = "python -m testbed.bench network --out FILE"


@dataclass(frozen=True)
class Link:
    alpha_s: float
    bandwidth_Bps: float


def fit(sizes: Sequence[float], seconds: Sequence[float]) -> Link:
    """Least-squares alpha + s/B through (size, one-way seconds); ValueError if it is not a line
    a network could have (B <= 0 or alpha < 0: the sizes were too close, or the times noise)."""
    if len(sizes) != len(seconds) or len(set(sizes)) < 2:
        raise ValueError("a fit needs one-way times at two sizes or more")
    n = len(sizes)
    mx, my = sum(sizes) / n, sum(seconds) / n
    sxx = sum((x - mx) ** 2 for x in sizes)
    slope = sum((x - mx) * (y - my) for x, y in zip(sizes, seconds, strict=True)) / sxx
    alpha = my - slope * mx
    if not slope > 0 or alpha < 0 or not math.isfinite(alpha):
        shown = ", ".join(f"{t:.3g}" for t in seconds)
        raise ValueError(f"times [{shown}] s at sizes {list(sizes)} B do not fit "
                         f"alpha + s/B (alpha {alpha:.3g} s, 1/B {slope:.3g} s/B); measure larger "
                         "sizes or more repeats")
    return Link(alpha_s=alpha, bandwidth_Bps=1.0 / slope)


@dataclass(frozen=True)
class Calibration:
    path: str
    links: Mapping[str, Link]
    scope: str
    inter_links: Mapping[str, Link] = field(default_factory=dict)  # measured across two nodes
    inter_scope: str | None = None
    provenance: Mapping[str, Any] = field(default_factory=dict)  # where it was measured

    def link(self, name: str, *, across: bool) -> tuple[Link, str]:
        """The link of path `name` for a run whose actors span nodes (`across`) or not, and a line
        saying which measurement it is. A run across nodes with no inter-node measurement gets the
        same-node link, and the line says so."""
        if across and name in self.inter_links:
            link, scope = self.inter_links[name], self.inter_scope
        else:
            link, scope = self.links[name], self.scope
            if across:
                scope += "; this run spans nodes but the file has no inter-node fit of this path: measure it on the cluster"
        return link, (f"calibration {self.path} ({name}: alpha {link.alpha_s * 1e6:.0f} us, "
                      f"{link.bandwidth_Bps / 1e9:.3g} GB/s, {scope})")


def load_calibration(path: str) -> Calibration:
    """Read a calibration file; ValueError naming the file, what is wrong and how to make one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read it ({exc}); measure one with {MEASURE}") from None
    if not isinstance(data, dict) or data.get("kind") != KIND or data.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"not a calibration file of schema {SCHEMA_VERSION}; measure one with {MEASURE}")
    links = _links(data.get("paths"))
    inter = data.get("inter_node") or {}
    if not isinstance(inter, dict):
        raise ValueError(f"inter_node is not an object; measure the file again with {MEASURE}")
    inter_links = _links(inter.get("paths"))
    if not links and not inter_links:  # a path whose times fit no line is kept aside, unfitted
        raise ValueError(f"it holds no fitted path; measure one with {MEASURE}")
    prov = data.get("provenance")
    return Calibration(path=str(path), links=links, scope=str(data.get("scope", "unknown")),
                       inter_links=inter_links, inter_scope=str(inter.get("scope", "across nodes")),
                       provenance=prov if isinstance(prov, dict) else {})


def _links(paths: Any) -> dict[str, Link]:
    """Each measured path's Link; ValueError unless every alpha_s is a finite number >= 0 and
    every bandwidth_Bps a finite number > 0 (a hand-edited `Infinity` or `NaN` included)."""
    if paths is not None and not isinstance(paths, dict):
        raise ValueError(f"paths is not an object; measure the file again with {MEASURE}")
    links = {}
    for name, entry in (paths or {}).items():
        if name not in PATHS:
            raise ValueError(f"path {name!r}: expected one of {', '.join(PATHS)}; measure the file "
                             f"again with {MEASURE}")
        values = [entry.get(k) if isinstance(entry, dict) else None for k in ("alpha_s", "bandwidth_Bps")]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise ValueError(f"path {name!r} has no numeric alpha_s and bandwidth_Bps; measure it "
                             f"again with {MEASURE}")
        link = Link(float(values[0]), float(values[1]))
        for key, value, rule in (("alpha_s", link.alpha_s, "a finite alpha >= 0"),
                                 ("bandwidth_Bps", link.bandwidth_Bps, "a finite bandwidth > 0")):
            if not math.isfinite(value) or value < 0 or (value == 0 and key == "bandwidth_Bps"):
                raise ValueError(f"path {name!r}: {key} is {value}, expected {rule} (s, B/s); "
                                 f"measure it again with {MEASURE}")
        links[name] = link
    return links


def calibration_doc(paths: Mapping[str, Mapping[str, Any]], scope: str,
                    provenance: Mapping[str, Any], created: str,
                    inter_node: tuple[Mapping[str, Mapping[str, Any]], str] | None = None) -> dict[str, Any]:
    """The file's content from the measured paths (each with its fit and samples), and the
    inter-node paths with their scope when two nodes were measured."""
    doc = {"schema_version": SCHEMA_VERSION, "kind": KIND, "created": created, "scope": scope,
           "provenance": dict(provenance), "paths": {k: dict(v) for k, v in paths.items()}}
    if inter_node is not None:
        doc["inter_node"] = {"scope": inter_node[1], "paths": {k: dict(v) for k, v in inter_node[0].items()}}
    return doc
