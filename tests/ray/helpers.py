"""Run a strategy in-process against the module's Ray (no CLI, no run folder)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from testbed.analysis.records import STEP_COLUMNS, UPDATE_COLUMNS, Recorder
from testbed.analysis.results import table_frame
from testbed.config import RunConfig, validate, with_overrides
from testbed.runtime.cluster import Cluster
from testbed.session.execute import summarize_run
from testbed.strategies.registry import SPECS


def make_config(**changes: Any) -> RunConfig:
    """A small config of the torch-free synthetic workload (a worker that imports torch costs about
    a CPU-second more to start); tests of the real models say `workload.name` = "mlp". A test runs
    at the --dilation it names, 1 unless it says (not auto, the command's default: the search is
    tested where it is asked for)."""
    base = RunConfig(strategy="mapreduce", workers=2, steps=5, seed=3)
    base = with_overrides(base, **{"workload.batch_size": 8, "workload.lr": 0.2, "cluster.timeout_s": 60.0,
                                   "workload.name": "synthetic", "workload.grad_mb": 0.01,
                                   "workload.compute_ms": 0.0, "network.dilation": 1.0})
    return validate(with_overrides(base, **changes), SPECS)


def run_strategy(cfg: RunConfig, *, workdir: str | None = None) -> dict[str, Any]:
    """Run cfg's strategy; return flat params, records as DataFrames, the summary and its extras."""
    spec = SPECS[cfg.strategy]
    rec = Recorder()
    cluster = Cluster(cfg.cluster, workers=cfg.real_workers, servers=spec.servers(cfg),
                      torch_workers=cfg.workload.imports_torch)
    with cluster, spec.create(cfg, cluster, workdir=workdir) as strategy:
        rec.dilate(cfg.network.dilation, origin=time.time())
        strategy.run(rec)
        params = strategy.parameters()
        extra = strategy.summary_extra()
        replicas = strategy.replica_parameters() if hasattr(strategy, "replica_parameters") else None
    flat = np.concatenate([np.asarray(v).ravel() for v in params.values()])
    steps = table_frame(rec.steps, STEP_COLUMNS)
    updates = table_frame(rec.updates, UPDATE_COLUMNS)
    extra = rec.summary_extras({**cluster.facts(), **extra})
    # the summary (with the cost model's prediction) as testbed.session writes it to summary.json
    summary = summarize_run(spec, cfg, steps, updates, extra, "completed")
    return {"flat": flat, "params": params, "extra": summary, "summary": summary, "replicas": replicas,
            "steps": steps, "updates": updates, "events": rec.events}
