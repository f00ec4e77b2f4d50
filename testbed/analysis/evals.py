"""Statistical efficiency beside hardware efficiency: held-out evaluations -> curves and time to target.

The raw records are `EvalRecord`s (version, held-out loss and accuracy, the evaluation's own time).
Each is placed on the run's clock by the update it evaluates:

    train_s(v)       = t_applied(v) - the first worker iteration's start   (0 for version 0)
    samples_seen(v)  = batch size * sum of contributors over updates 1..v   (gradients applied)

so a curve can be drawn against wall time, model updates or samples, and "time to target" is
the first evaluated version whose loss is <= --target-loss (and accuracy >= --target-acc when
both are given). It is an upper bound by at most one evaluation interval: the run is evaluated
every --eval-every updates, not after each. Pure: pandas in, plain values out.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

POINT_COLUMNS = ("version", "train_s", "samples_seen", "eval_loss", "eval_acc", "eval_ms", "t_applied",
                 "t_done")


def eval_points(evals: pd.DataFrame, updates: pd.DataFrame, steps: pd.DataFrame,
                batch_size: int) -> pd.DataFrame:
    """One row per evaluated version (the last evaluation of a version wins), in version order."""
    if not len(evals):
        return pd.DataFrame({c: pd.Series(dtype=float) for c in POINT_COLUMNS})
    ev = evals.sort_values("t_done", kind="stable").drop_duplicates("version", keep="last")
    ev = ev.sort_values("version", kind="stable").reset_index(drop=True)
    t0 = float(steps["t_start"].min()) if len(steps) else np.nan
    ups = updates.sort_values("version", kind="stable")
    applied = dict(zip(ups["version"].astype(int), ups["t_applied"].astype(float), strict=True))
    seen = dict(zip(ups["version"].astype(int), batch_size * ups["contributors"].astype(int).cumsum(),
                    strict=True))
    versions = ev["version"].astype(int)
    t_applied = [t0 if v == 0 else applied.get(v, np.nan) for v in versions]
    out = pd.DataFrame({
        "version": versions,
        "train_s": [t - t0 for t in t_applied],
        "samples_seen": [0 if v == 0 else seen.get(v, np.nan) for v in versions],
        "eval_loss": ev["eval_loss"].astype(float),
        "eval_acc": ev["eval_acc"].astype(float),
        "eval_ms": ev["eval_ms"].astype(float),
        "t_applied": t_applied,
        "t_done": ev["t_done"].astype(float),
    })
    return out[list(POINT_COLUMNS)]


def reached(points: pd.DataFrame, target_loss: float | None, target_acc: float | None) -> pd.Series:
    """Which evaluated versions meet every target given."""
    ok = pd.Series(True, index=points.index)
    if target_loss is not None:
        ok &= points["eval_loss"] <= target_loss
    if target_acc is not None:
        ok &= points["eval_acc"] >= target_acc
    return ok


def eval_summary(points: pd.DataFrame, target_loss: float | None, target_acc: float | None,
                 optimum: float | None) -> dict[str, Any]:
    """The summary's evaluation keys (null where there is nothing to say)."""
    out: dict[str, Any] = {"evaluations": len(points), "eval_loss_optimum": optimum,
                           "eval_loss_last": None, "eval_acc_last": None, "eval_loss_best": None,
                           "target_loss": target_loss, "target_acc": target_acc,
                           "time_to_target_s": None, "updates_to_target": None, "samples_to_target": None}
    if not len(points):
        return out
    last = points.iloc[-1]
    out["eval_loss_last"] = float(last["eval_loss"])
    out["eval_acc_last"] = None if pd.isna(last["eval_acc"]) else float(last["eval_acc"])
    out["eval_loss_best"] = float(points["eval_loss"].min())
    if target_loss is None and target_acc is None:
        return out
    hit = points[reached(points, target_loss, target_acc)]
    if len(hit):
        first = hit.iloc[0]
        out["time_to_target_s"] = None if pd.isna(first["train_s"]) else float(first["train_s"])
        out["updates_to_target"] = int(first["version"])
        out["samples_to_target"] = None if pd.isna(first["samples_seen"]) else int(first["samples_seen"])
    return out
