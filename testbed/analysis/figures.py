"""What every figure shares: an Agg figure, saving, legends, colours, series labels, NoData.

Pure (no Ray, no pyplot). `plots.py` draws sweep-table figures and `runplots.py` per-run
figures; both build on these.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from testbed.config import leaves

# Repeat-like keys: rows differing only in these are averaged, not split into series.
NOT_SERIES = ("strategy", "seed", "out", "quiet")


class NoData(ValueError):
    """The table lacks the columns or rows a figure needs."""


def new_figure(ncols: int = 1, width: float = 6.4, height: float = 4.4) -> tuple[Figure, list]:
    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    FigureCanvasAgg(fig)  # Agg, explicitly: never a GUI backend, never plt.show
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def save(fig: Figure, path_stem: str | os.PathLike) -> list[Path]:
    """Write PATH_STEM.png and PATH_STEM.svg (tmp + rename); return both paths."""
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in ("png", "svg"):
        path = stem.with_name(f"{stem.name}.{ext}")  # with_suffix would eat a dotted stem
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        fig.savefig(tmp, format=ext, dpi=120, bbox_inches="tight")  # a long title or an outside legend stays whole
        os.replace(tmp, path)
        paths.append(path)
    return paths


def fmt(value: object) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def series_labels(table: pd.DataFrame, exclude: tuple[str, ...] = ("workers",)) -> pd.Series:
    """Label rows "strategy key=value ...", naming keys that vary within the strategy's rows.
    With "workers" excluded, a key that only follows N (one value per N: the real workers or the
    workers per process a run chose for its size) splits nothing either: the points name N."""
    keys = [k for k in [k for k, _ in leaves()] if k in table.columns and k not in NOT_SERIES + exclude]
    strategy = table["strategy"] if "strategy" in table.columns else pd.Series("run", index=table.index)
    labels = pd.Series("", index=table.index, dtype=object)
    for name, group in table.groupby(strategy, sort=False):
        varied = [k for k in keys if group[k].map(fmt).nunique() > 1
                  and not ("workers" in exclude and "workers" in group.columns
                           and group[k].map(fmt).groupby(group["workers"]).nunique().max() == 1)]
        for i in group.index:
            parts = [("N" if k == "workers" else k.split(".")[-1]) + "=" + fmt(group.at[i, k])
                     for k in varied]
            labels[i] = " ".join([str(name), *parts])
    return labels


def legend(ax, handles: list | None = None, labels: list[str] | None = None) -> None:
    """Legend inside the axes when short; beside them when long, so it hides no data."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if len(handles) <= 4:
        ax.legend(handles, labels, fontsize="small")
    else:  # widen the figure by the legend's width so the axes keep theirs (and heighten it to
        fig = ax.get_figure()  # hold every line of a long legend)
        fig.set_figwidth(fig.get_figwidth() + 0.3 + 0.055 * max(map(len, labels)))
        fig.set_figheight(max(fig.get_figheight(), 0.6 + 0.16 * len(labels)))
        ax.legend(handles, labels, fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1))


def colors(n: int) -> list:
    """Distinct colours for n lines (tab10, or tab20 past ten so none repeats)."""
    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]
