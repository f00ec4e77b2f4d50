"""Run a strategy in-process against the module's Ray (no CLI, no run folder)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from testbed import registry
from testbed.analysis.metrics import summarize
from testbed.config import RunConfig, validate, with_overrides
from testbed.runtime.cluster import Cluster
from testbed.session import _predictions, servers_for
from testbed.strategy import STEP_COLUMNS, UPDATE_COLUMNS, Recorder


def make_config(**changes: Any) -> RunConfig:
    base = RunConfig(strategy="mapreduce", workers=2, steps=5, seed=3)
    base = with_overrides(base, **{"workload.batch_size": 8, "workload.lr": 0.2,
                                   "cluster.timeout_s": 60.0})
    return validate(with_overrides(base, **changes), registry.families())


def run_strategy(cfg: RunConfig, *, workdir: str | None = None) -> dict[str, Any]:
    """Run cfg's strategy; return flat params, records as DataFrames, summary extras."""
    cls = registry.STRATEGIES[cfg.strategy]
    rec = Recorder()
    cluster = Cluster(cfg.cluster, workers=cfg.workers, servers=servers_for(cfg),
                      torch_workers=cfg.workload.name != "synthetic")
    with cluster, cls(cfg, cluster, workdir=workdir) as strategy:
        strategy.run(rec)
        params = strategy.parameters()
        extra = strategy.summary_extra()
        replicas = strategy.replica_parameters() if hasattr(strategy, "replica_parameters") else None
    flat = np.concatenate([np.asarray(v).ravel() for v in params.values()])
    steps = pd.DataFrame(rec.steps, columns=list(STEP_COLUMNS))
    updates = pd.DataFrame(rec.updates, columns=list(UPDATE_COLUMNS))
    extra = {**rec.extra, **extra}
    # the cost-model prediction, as testbed.session adds it to summary.json
    summary = summarize(steps, updates, strategy=cfg.strategy, workers=cfg.workers, status="completed")
    extra.update(_predictions(cfg, summary, steps, updates, extra))
    return {"flat": flat, "params": params, "extra": extra, "replicas": replicas,
            "steps": steps, "updates": updates}
