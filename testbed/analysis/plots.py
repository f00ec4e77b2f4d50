"""Figures from result tables. Pure: DataFrames in, matplotlib Figures out, no Ray, no pyplot.

Every figure is a `matplotlib.figure.Figure` on its own Agg canvas (no global state, nothing is
shown); `save(fig, stem)` writes stem.png and stem.svg atomically. Table figures use the rows
of a sweep table (`testbed.results.load_table`) whose status is "completed" and average repeats
(error bars: one standard deviation). A series is a strategy plus the config keys that vary
among that strategy's rows, so keys that do not apply to a strategy never split its series.
A function raises `NoData` when the table lacks what it needs; `figures_for_sweep` skips it.
The per-run figures (staleness histogram, loss vs updates / time) live in `testbed.analysis.runplots`
and the held-out curves and time-to-target table in `testbed.analysis.convergence`; both are
importable from here too.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from testbed.analysis import convergence
from testbed.analysis.convergence import (
    convergence_vs_samples,
    convergence_vs_time,
    time_to_target_table,
)
from testbed.analysis.figures import NoData, fmt, legend, new_figure, save, series_labels
from testbed.analysis.placement import placement_figure
from testbed.analysis.runplots import loss_vs_time, loss_vs_updates, staleness_histogram

__all__ = ["NoData", "convergence_vs_samples", "convergence_vs_time", "figures_for_sweep", "loss_vs_time",
           "loss_vs_updates", "measured_vs_predicted", "run_tables", "save", "series_labels",
           "staleness_histogram", "step_breakdown", "straggler_impact", "throughput_vs_workers",
           "time_to_target_table"]

PHASE_COLORS = {"compute": "#4c72b0", "comm": "#dd8452", "wait": "#8c8c8c"}


def _rows(table: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Completed rows with a value in every column; NoData if there are none."""
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise NoData(f"table has no column {', '.join(missing)}")
    rows = table[table["status"] == "completed"] if "status" in table.columns else table
    rows = rows.dropna(subset=columns)
    if rows.empty:
        raise NoData(f"no completed rows with {', '.join(columns)}")
    return rows


def _context(table: pd.DataFrame) -> str:
    """What was run, for titles: N range, workload, gradient size, network."""
    parts = []
    if "workers" in table.columns and table["workers"].notna().any():
        lo, hi = int(table["workers"].min()), int(table["workers"].max())
        parts.append(f"N={lo}" if lo == hi else f"N={lo}-{hi}")
    names = sorted(table["workload.name"].dropna().unique()) if "workload.name" in table.columns else []
    if names:
        parts.append("/".join(map(str, names)))
    if "steps" in table.columns and table["steps"].notna().any():
        parts.append(f"{'/'.join(fmt(s) for s in sorted(table['steps'].dropna().unique()))} updates")
    if "synthetic" in names and "workload.grad_mb" in table.columns:
        sizes = sorted(table["workload.grad_mb"].dropna().unique())
        parts.append("grad " + "/".join(fmt(float(s)) for s in sizes) + " MiB")
    if "network.bandwidth" in table.columns:
        bw = table["network.bandwidth"].dropna().unique()
        lat = table["network.latency"].dropna().unique() if "network.latency" in table.columns else []
        net = f"net {'/'.join(map(str, bw))}, {'/'.join(map(str, lat))}"
        parts.append(net if len(bw) else "real network")
    return ", ".join(parts)


def _title(what: str, rows: pd.DataFrame) -> str:
    context = _context(rows)
    return f"{what}\n{context}" if context else what


def _mean_std(rows: pd.DataFrame, by: list[str], col: str) -> pd.DataFrame:
    return rows.groupby(by, sort=False)[col].agg(["mean", "std"]).fillna({"std": 0.0})


# ---------------------------------------------------------------- table figures


def throughput_vs_workers(table: pd.DataFrame) -> Figure:
    """Samples/s vs N per series with the ideal-linear line, and scaling efficiency."""
    rows = _rows(table, ["workers", "samples_per_s"])
    if rows["workers"].nunique() < 2:
        raise NoData("needs at least two worker counts")
    rows = rows.assign(_series=series_labels(rows))
    fig, (ax, eff) = new_figure(2)
    for label, group in rows.groupby("_series", sort=False):
        agg = _mean_std(group, ["workers"], "samples_per_s").sort_index()
        n, thr = agg.index.to_numpy(float), agg["mean"].to_numpy()
        ideal = thr[0] * n / n[0]  # linear from the series' smallest N
        line = ax.errorbar(n, thr, yerr=agg["std"], marker="o", capsize=3, label=label)
        color = line[0].get_color()
        ax.plot(n, ideal, ls="--", color=color, alpha=0.5)
        eff.plot(n, 100 * thr / ideal, marker="o", color=color, label=label)
    ticks = sorted(rows["workers"].unique())
    for a in (ax, eff):
        a.set_xscale("log", base=2)
        a.set_xticks(ticks, [str(int(t)) for t in ticks])
        a.set_xlabel("workers N")
        a.grid(alpha=0.3)
    handles, names = ax.get_legend_handles_labels()
    handles.append(Line2D([], [], ls="--", color="gray"))
    legend(eff if len(handles) > 4 else ax, handles, [*names, "ideal linear (from smallest N)"])
    lo, hi = rows["samples_per_s"].min(), rows["samples_per_s"].max()
    if lo > 0 and hi / lo > 20:
        ax.set_yscale("log")  # strategies an order of magnitude apart stay readable
    ax.set_ylabel("throughput (samples/s)")
    ax.set_title("Throughput")
    eff.axhline(100, color="gray", ls=":")
    eff.set_ylabel("scaling efficiency (% of ideal linear)")
    eff.set_title("Scaling efficiency")
    fig.suptitle(_title("Throughput vs workers", rows))
    return fig


def step_breakdown(table: pd.DataFrame) -> Figure:
    """Mean step time per series and N, split by the compute / comm / wait shares."""
    phases = ["compute", "comm", "wait"]
    cols = ["step_time_mean_s"] + [f"{p}_frac" for p in phases]
    rows = _rows(table, ["workers", *cols])
    rows = rows.assign(_series=series_labels(rows))
    order = list(rows["_series"].unique())
    agg = rows.groupby(["_series", "workers"], sort=False)[cols].mean()
    agg = agg.reindex(sorted(agg.index, key=lambda k: (order.index(k[0]), k[1])))
    names = [f"{s}  N={int(n)}" for s, n in agg.index]
    # Horizontal bars: long series names stay readable however many there are.
    fig, (ax,) = new_figure(1, width=6 + 0.07 * max(map(len, names)), height=1.6 + 0.32 * len(agg))
    y, left = np.arange(len(agg))[::-1], np.zeros(len(agg))
    for p in phases:
        width = 1e3 * agg["step_time_mean_s"].to_numpy() * agg[f"{p}_frac"].to_numpy()
        ax.barh(y, width, left=left, color=PHASE_COLORS[p], label=p)
        left += width
    ax.set_yticks(y, names, fontsize="small")
    ax.set_ylabel("strategy and workers N")
    ax.set_xlabel("mean step time (ms), split by share of worker time")
    ax.legend(title="phase", fontsize="small")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(_title("Where a step's time goes", rows))
    return fig


def measured_vs_predicted(table: pd.DataFrame) -> Figure:
    """Measured communication per step against the alpha-beta prediction, with y = x."""
    rows = _rows(table, ["comm_s_per_step", "predicted_comm_s"])
    rows = rows.assign(_series=series_labels(rows))
    fig, (ax,) = new_figure(1, width=6.8)
    for label, group in rows.groupby("_series", sort=False):
        pred, meas = 1e3 * group["predicted_comm_s"], 1e3 * group["comm_s_per_step"]
        ax.scatter(pred, meas, label=label)
        if "workers" in group.columns:
            for p, m, n in zip(pred, meas, group["workers"], strict=True):
                ax.annotate(f"N={int(n)}", (p, m), fontsize="x-small", xytext=(3, 3),
                            textcoords="offset points")
    values = np.concatenate([1e3 * rows["predicted_comm_s"], 1e3 * rows["comm_s_per_step"]])
    positive = values[values > 0]
    if len(positive) and positive.max() / positive.min() > 20:
        ax.set_xscale("log")
        ax.set_yscale("log")
    lo, hi = (positive.min(), positive.max()) if len(positive) else (0.0, 1.0)
    ax.plot([lo, hi], [lo, hi], color="gray", ls="--", label="y = x (model exact)")
    ax.set_xlabel("predicted communication per step (ms)")
    ax.set_ylabel("measured communication per step (ms)")
    legend(ax)
    ax.grid(alpha=0.3)
    ax.set_title(_title("Measured vs alpha-beta model", rows))
    return fig


def straggler_impact(table: pd.DataFrame) -> Figure:
    """Mean step time per straggler setting (column `straggler`), one bar per series."""
    rows = _rows(table, ["straggler", "step_time_mean_s"])
    if rows["straggler"].nunique() < 2:
        raise NoData("needs at least two straggler settings")
    rows = rows.assign(_series=series_labels(rows, exclude=("straggler",)))
    cats, series = list(rows["straggler"].unique()), list(rows["_series"].unique())
    agg = _mean_std(rows, ["_series", "straggler"], "step_time_mean_s")
    fig, (ax,) = new_figure(1, width=max(6.4, 1.6 * len(cats) + 2))
    width = 0.8 / len(series)
    for j, label in enumerate(series):
        means = [agg["mean"].get((label, c), np.nan) * 1e3 for c in cats]
        stds = [agg["std"].get((label, c), 0.0) * 1e3 for c in cats]
        ax.bar(np.arange(len(cats)) + (j - (len(series) - 1) / 2) * width, means, width,
               yerr=stds, capsize=3, label=label)
    wrapped = [textwrap.fill(str(c).replace(",", ", "), 24, break_long_words=False) for c in cats]
    ax.set_xticks(np.arange(len(cats)), wrapped, fontsize="small")
    ax.set_xlabel("injected straggler delay (--straggler)")
    ax.set_ylabel("mean step time (ms)")
    legend(ax)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(_title("Straggler impact", rows))
    return fig


def figures_for_sweep(table: pd.DataFrame, out_dir: str | os.PathLike,
                      steps_by_label: Mapping[str, pd.DataFrame] | None = None,
                      updates_by_label: Mapping[str, pd.DataFrame] | None = None) -> list[Path]:
    """Draw and save every figure the data supports; return the PNG paths."""
    steps, updates = steps_by_label or {}, updates_by_label or {}
    stale = any((s.get("staleness", pd.Series(dtype=float)) > 0).any() for s in steps.values())
    makers = [("throughput_vs_workers", lambda: throughput_vs_workers(table)),
              ("step_breakdown", lambda: step_breakdown(table)),
              ("measured_vs_predicted", lambda: measured_vs_predicted(table)),
              ("straggler_impact", lambda: straggler_impact(table)),
              ("placement", lambda: placement_figure(table)),
              ("staleness_histogram", lambda: staleness_histogram(steps) if stale else None),
              ("loss_vs_updates", lambda: loss_vs_updates(updates)),
              ("loss_vs_time", lambda: loss_vs_time(updates)),
              ("convergence_vs_time", lambda: convergence_vs_time(table)),
              ("convergence_vs_samples", lambda: convergence_vs_samples(table))]
    written = []
    convergence.write_table(table, out_dir)  # time_to_target.md, where runs were evaluated
    for stem, make in makers:
        try:
            fig = make()
        except NoData:
            continue
        if fig is not None:  # staleness is drawn only when some gradient was stale
            written.append(save(fig, Path(out_dir) / stem)[0])
    return written


def run_tables(table: pd.DataFrame, kind: str, *, repeat: int = 0) -> dict[str, pd.DataFrame]:
    """{series label: steps or updates table} for the completed runs of one repeat (the per-run
    figures' input), read from the run folders a sweep table points to (`results.run_table`)."""
    from testbed.analysis.results import run_table

    rows = table[(table["status"] == "completed") & (table["repeat"] == repeat)]
    labels = series_labels(rows, exclude=())
    return {labels[i]: run_table(rows.at[i, "run_dir"], kind) for i in rows.index
            if rows.at[i, "run_dir"] and Path(rows.at[i, "run_dir"]).is_dir()}
