"""Configurations x cells -> predictions: one row per (latency, bandwidth, workers, configuration).

The configurations are each registered strategy's own (`StrategySpec.map_variants`), each one
validated as `testbed.run` validates a run. What `predict` reads is what a run resolves at setup,
taken without Ray: the workload a worker builds (`testbed.workloads.tensor_plan`, with one element
per tensor: the logical sizes and backward shares are the profile's whatever the payload) gives the
tensor sizes, and the strategy's `plan` turns them into its gradient bytes and buckets. The
prediction is then the one a run's summary carries: `predicted_step_s = compute + predict().comm_s`
(testbed.analysis.predict), on the cell's link -- the emulated (latency, bandwidth), or with
--calibration the measured alpha and bandwidth of the path the configuration's messages take.
Pure: no Ray.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pandas as pd

from testbed.analysis.costmodel import NotModelled
from testbed.config import ConfigError, RunConfig, validate, with_overrides
from testbed.config.calibration import load_calibration
from testbed.map.grid import CALIBRATED, Grid
from testbed.strategies.contract import StrategySpec, Variant
from testbed.strategies.registry import SPECS
from testbed.util import units
from testbed.workloads import tensor_plan

CELL = ["latency", "bandwidth", "workers"]


@dataclass(frozen=True)
class Configuration:
    spec: StrategySpec
    variant: Variant
    config: RunConfig | None  # None: the variant is refused at this N (`refused` says why)
    refused: str | None = None


def configurations(base: RunConfig, n: int, node_size: int | None = None) -> list[Configuration]:
    """Every registered strategy's variants at N workers, each validated as a run would be."""
    n = int(n)  # a count read back from a table may be numpy's integer, which the config refuses
    out = []
    for name, spec in SPECS.items():
        own = with_overrides(base, strategy=name, workers=n)
        if node_size is not None and "ring.node_size" in spec.keys:  # the cluster's machines, for who groups by them
            own = with_overrides(own, **{"ring.node_size": node_size})
        for variant in spec.map_variants(own):
            try:
                cfg = whole_rounds(spec, with_overrides(own, **variant.overrides))
                out.append(Configuration(spec, variant, validate(cfg, SPECS)))
            except ConfigError as exc:
                out.append(Configuration(spec, variant, None, str(exc)))
    return out


def whole_rounds(spec: StrategySpec, cfg: RunConfig, steps: int | None = None) -> RunConfig:
    """cfg with `steps` (its own by default) rounded up to whole communication rounds of the
    strategy (`period`): a prediction spread over the iterations is then the steady state's, one
    round in H, in the map and in a check alike."""
    period, steps = spec.period(cfg), cfg.steps if steps is None else steps
    return with_overrides(cfg, steps=period * -(-steps // period))


def link_of(spec: StrategySpec, cfg: RunConfig, latency: str, bandwidth: str,
            calibration: str | None) -> tuple[float, float]:
    """(alpha s, bandwidth B/s) of a cell for this configuration: the emulated link, or the
    calibration's fit of the path its messages take (`message_path`, on one node)."""
    if bandwidth == CALIBRATED:
        link, _ = load_calibration(calibration).link(spec.message_path(cfg), across=False)
        return link.alpha_s, link.bandwidth_Bps
    return units.parse_duration(latency, flag="--latency"), units.parse_bandwidth(bandwidth, flag="--bandwidth")


def predictions(grid: Grid, progress: bool = False) -> pd.DataFrame:
    """One row per cell and configuration: the spec's prediction, or why there is none."""
    base = grid.base()
    sizes, shares = tensor_plan(base.workload, seed=base.seed)
    rows: list[dict[str, Any]] = []
    counts: Any = grid.workers
    if progress:
        from tqdm import tqdm

        counts = tqdm(grid.workers, desc="predictions", unit="N", dynamic_ncols=True)
    for n in counts:
        for c in configurations(base, n, grid.node_size):
            plan = None if c.config is None else c.spec.plan(c.config, sizes, shares)
            for latency, bandwidth in grid.links():
                rows.append(_row(c, plan, n, latency, bandwidth, grid.calibration))
    return pd.DataFrame(rows)


def _row(c: Configuration, plan: dict[str, Any] | None, n: int, latency: str, bandwidth: str,
         calibration: str | None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "latency": latency, "bandwidth": bandwidth, "workers": n, "label": c.variant.label,
        "strategy": c.spec.name, "family": c.spec.family, "exact": c.variant.exact,
        "kind": c.variant.kind or c.variant.label, "per_gradient": c.variant.per_gradient,
        "overrides": json.dumps(dict(c.variant.overrides), sort_keys=True),
        "synchronous": None if c.config is None else c.spec.synchronous(c.config),
        "compute_s": None, "predicted_comm_s": None, "predicted_step_s": None, "formula": None, "note": c.refused,
    }
    if c.config is None or plan is None:
        return row
    if bandwidth == CALIBRATED and c.spec.message_path(c.config) not in load_calibration(calibration).links:
        row["note"] = f"the calibration has no '{c.spec.message_path(c.config)}' path"
        return row
    alpha, bps = link_of(c.spec, c.config, latency, bandwidth, calibration)
    try:
        pred = c.spec.predict(c.config, plan, alpha, bps)
    except NotModelled as exc:
        row["note"] = f"not modelled: {exc}"
        return row
    compute = c.config.workload.compute_ms / 1000.0  # as testbed.analysis.predict: --compute-ms
    row.update(compute_s=compute, predicted_comm_s=pred.comm_s, predicted_step_s=compute + pred.comm_s,
               formula=pred.formula, grad_bytes_logical=plan["grad_bytes_logical"])
    return row


def config_of(grid: Grid, row: pd.Series) -> RunConfig:
    """The validated run config of one row (a configuration at its cell's N), emulated on the
    cell's link: what a check runs."""
    base = grid.base()
    own = with_overrides(base, strategy=row["strategy"], workers=int(row["workers"]))
    if grid.node_size is not None and "ring.node_size" in SPECS[row["strategy"]].keys:
        own = with_overrides(own, **{"ring.node_size": grid.node_size})
    own = with_overrides(own, **json.loads(row["overrides"]))
    if row["bandwidth"] != CALIBRATED:
        own = with_overrides(own, **{"network.bandwidth": row["bandwidth"], "network.latency": row["latency"]})
    return validate(own, SPECS)
