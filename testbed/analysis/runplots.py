"""Per-run figures: one line per run, from its steps.parquet or updates.parquet tables.

Pure like `testbed.analysis.plots` (which re-exports them; helpers in `figures.py`): a mapping
{series label: table} in (`testbed.results.run_tables` builds it), a matplotlib Figure out.
Each raises `testbed.analysis.figures.NoData` when no table has what it needs.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from testbed.analysis.figures import NoData, colors, legend, new_figure

__all__ = ["loss_vs_time", "loss_vs_updates", "staleness_histogram"]


def staleness_histogram(steps_by_label: Mapping[str, pd.DataFrame]) -> Figure:
    """Distribution of staleness over applied gradients (steps.parquet), one line per label."""
    data = {label: s.loc[s["version_applied"].notna(), "staleness"].to_numpy(float)
            for label, s in steps_by_label.items()
            if {"staleness", "version_applied"} <= set(s.columns)}
    data = {k: v for k, v in data.items() if len(v)}
    if not data:
        raise NoData("no applied gradients with a staleness")
    top = int(max(v.max() for v in data.values()))
    bins = np.arange(-0.5, top + 1.5)
    fig, (ax,) = new_figure(1)
    for color, (label, values) in zip(colors(len(data)), data.items(), strict=True):
        ax.hist(values, bins=bins, weights=np.full(len(values), 1 / len(values)),
                histtype="step", linewidth=1.5, label=label, color=color)
    ax.set_xlabel("staleness (server versions between read and apply)")
    ax.set_ylabel("fraction of applied gradients")
    legend(ax)
    ax.grid(alpha=0.3)
    ax.set_title("Gradient staleness")
    return fig


def _loss_lines(updates_by_label: Mapping[str, pd.DataFrame], x_of, xlabel: str, title: str) -> Figure:
    data = {k: u.sort_values("version") for k, u in updates_by_label.items()
            if {"version", "t_applied", "loss"} <= set(u.columns) and len(u.dropna(subset=["loss"]))}
    if not data:
        raise NoData("no updates with a loss")
    fig, (ax,) = new_figure(1)
    for color, (label, u) in zip(colors(len(data)), data.items(), strict=True):
        ax.plot(x_of(u), u["loss"], label=label, color=color)
    if all((u["loss"] > 0).all() for u in data.values()):
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("training loss (mean over contributors)")
    legend(ax)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    return fig


def loss_vs_updates(updates_by_label: Mapping[str, pd.DataFrame]) -> Figure:
    """Loss after each model update (updates.parquet), one line per label."""
    return _loss_lines(updates_by_label, lambda u: u["version"], "model updates applied",
                       "Loss vs model updates")


def loss_vs_time(updates_by_label: Mapping[str, pd.DataFrame]) -> Figure:
    """Loss against wall time since the first update (time-to-loss), one line per label."""
    return _loss_lines(updates_by_label, lambda u: u["t_applied"] - u["t_applied"].min(),
                       "wall time since first update (s)", "Loss vs time (time-to-loss)")
