"""Raw records -> summary statistics. Pure: DataFrames in, plain dict out, no Ray.

Definitions (the README and results/README.md repeat them):
- training wall time: first worker iteration's start -> last model update.
- step time: interval between consecutive model updates (the first from the first start).
- samples/s: samples of gradients that were applied, / training wall time; a real worker's
  samples count once for it and once for each emulated peer it plays (`weights`), unless the
  peers have rows of their own (`emulated`: ps-async's), which count themselves.
- compute / comm / wait fractions: shares of the summed worker time; an injected straggler
  delay counts as compute (the worker is slow), and is also reported on its own.
- bytes per worker per step: mean logical bytes a worker sent per iteration.
- staleness: version at apply - version read, over applied gradients.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def summarize(steps: pd.DataFrame, updates: pd.DataFrame, *, strategy: str, workers: int,
              status: str, weights: dict[int, int] | None = None) -> dict[str, Any]:
    """Derive the summary of one run from its raw tables. `weights`: worker -> the workers it
    stands for, where some are emulated peers (testbed.emulation.peers.weights)."""
    n_updates = len(updates)
    if "emulated" in steps and steps["emulated"].fillna(False).astype(bool).any():
        weights = None  # the peers' iterations are rows of their own
    applied = steps[steps["version_applied"].notna()] if len(steps) else steps
    out: dict[str, Any] = {"strategy": strategy, "workers": workers, "steps": n_updates,
                           "status": status, "worker_iterations": len(steps)}
    if len(steps) == 0 or n_updates == 0:
        out.update({k: None for k in (
            "samples_per_s", "updates_per_s", "step_time_p50_s", "step_time_p95_s",
            "step_time_mean_s", "compute_frac", "comm_frac", "wait_frac", "injected_delay_frac",
            "bytes_sent_per_worker_per_step", "bytes_recv_per_worker_per_step",
            "loss_first", "loss_last", "train_wall_s", "staleness_mean", "staleness_p95",
            "staleness_max")})
        out["dropped_gradients"] = 0
        out["updates_per_worker"] = {}  # same keys as a run with updates
        out["straggler_attribution"] = {}
        return out
    t0 = float(steps["t_start"].min())
    t_applied = updates["t_applied"].to_numpy(dtype=float)
    wall = max(float(t_applied.max()) - t0, 1e-12)
    intervals = np.diff(np.concatenate([[t0], np.sort(t_applied)]))
    compute = float(steps["compute_s"].sum())
    injected = float(steps["injected_delay_s"].sum())
    comm = float(steps["comm_s"].sum())
    wait = float(steps["wait_s"].sum())
    total = max(compute + injected + comm + wait, 1e-12)
    ordered = updates.sort_values("version", kind="stable")  # records may arrive out of order
    stale = applied["staleness"].to_numpy(dtype=float)
    out.update({
        "train_wall_s": wall,
        "samples_per_s": _samples(applied, weights) / wall,
        "updates_per_s": n_updates / wall,
        "step_time_p50_s": _pct(intervals, 50),
        "step_time_p95_s": _pct(intervals, 95),
        "step_time_mean_s": float(intervals.mean()),
        "compute_frac": (compute + injected) / total,
        "comm_frac": comm / total,
        "wait_frac": wait / total,
        "injected_delay_frac": injected / total,
        "bytes_sent_per_worker_per_step": float(steps["bytes_sent"].mean()),
        "bytes_recv_per_worker_per_step": float(steps["bytes_recv"].mean()),
        "loss_first": float(ordered["loss"].iloc[0]),
        "loss_last": float(ordered["loss"].iloc[-1]),
        "staleness_mean": float(stale.mean()) if len(stale) else None,
        "staleness_p95": _pct(stale, 95),
        "staleness_max": int(stale.max()) if len(stale) else None,
        "dropped_gradients": int(updates["dropped"].sum()),
        "updates_per_worker": {int(w): int(c) for w, c in applied.groupby("worker").size().items()},
        "straggler_attribution": straggler_attribution(steps),
    })
    return out


def _samples(applied: pd.DataFrame, weights: dict[int, int] | None) -> float:
    if not weights or all(w == 1 for w in weights.values()):
        return float(applied["samples"].sum())
    return float((applied["samples"] * applied["worker"].map(weights).fillna(1)).sum())


def straggler_attribution(steps: pd.DataFrame) -> dict[int, dict[str, float]]:
    """Per worker: how late it was ready at each sync point, and how long it waited there.

    ready = t_start + compute + injected delay (the moment its gradient could leave);
    ready_lag = ready - the earliest ready of that iteration. A straggler has a large lag and
    a small wait; the workers it holds back have the reverse. Barriers hide this in step
    times alone.
    """
    if len(steps) == 0:
        return {}
    ready = steps["t_start"] + steps["compute_s"] + steps["injected_delay_s"]
    lag = ready - ready.groupby(steps["iteration"]).transform("min")
    frame = pd.DataFrame({"worker": steps["worker"], "lag": lag, "wait": steps["wait_s"]})
    means = frame.groupby("worker")[["lag", "wait"]].mean()
    return {int(w): {"ready_lag_s": float(r["lag"]), "wait_s": float(r["wait"])} for w, r in means.iterrows()}
