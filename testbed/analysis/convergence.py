"""Accuracy per second beside samples per second: held-out curves of a sweep and time to target.

For a sweep whose runs were evaluated (evals.parquet, `testbed.analysis.evals`):

    convergence_vs_time     held-out loss against training wall time, one panel per setting
                            (workload x straggler x network), one line per strategy variant
    convergence_vs_samples  the same against samples seen, in global batches (N x batch size):
                            the model updates of a synchronous strategy; an asynchronous one
                            applies N gradients per global batch, so staleness shows as a curve
                            below the synchronous ones in time and above them in samples
    time_to_target_table    markdown: per setting and variant, time / updates / samples to the
                            run's target, the last held-out loss (and accuracy), samples/s

Pure (no Ray): the sweep table and the run folders it points to in, figures and text out.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from testbed.analysis.figures import NoData, colors, fmt, series_labels
from testbed.analysis.results import run_evals

SETTING = ("workload.name", "straggler", "network.bandwidth")  # what a panel holds fixed


def _completed(table: pd.DataFrame) -> pd.DataFrame:
    if not {"status", "run_dir"} <= set(table.columns):
        raise NoData("no run status or run folders")
    rows = table[table["status"] == "completed"]
    if "repeat" in rows.columns:
        rows = rows[rows["repeat"] == 0]
    if "evaluations" not in rows.columns or not (rows["evaluations"].fillna(0) > 0).any():
        raise NoData("no evaluated runs")
    return rows[rows["evaluations"].fillna(0) > 0]


def settings(table: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """(workload, setting, its rows) per combination of the SETTING columns, in table order;
    the setting names what differs from this machine as it is ("as is" when nothing does)."""
    keys = [k for k in SETTING if k in table.columns]
    out = []
    for values, rows in table.groupby([table[k].map(fmt) for k in keys], sort=False):
        values = values if isinstance(values, tuple) else (values,)
        named = dict(zip(keys, values, strict=True))
        rest = ", ".join(f"{k.split('.')[-1]} {v}" for k, v in named.items() if k != SETTING[0] and v != "none")
        out.append((named.get(SETTING[0], "runs"), rest or "as is", rows))
    return out


def variant_labels(rows: pd.DataFrame) -> pd.Series:
    """A line's name: its strategy and the keys that vary between the lines of one panel."""
    return series_labels(rows, exclude=(*SETTING, "steps", "workers", "eval.target_loss", "eval.target_acc",
                                        "workload.optimizer", "network.latency"))


def _curves(table: pd.DataFrame, x: Callable[[pd.DataFrame, pd.Series], pd.Series], xlabel: str,
            title: str) -> Figure:
    rows = _completed(table)
    panels = settings(rows)
    workloads = list(dict.fromkeys(w for w, _, _ in panels))
    columns = list(dict.fromkeys(c for _, c, _ in panels))
    fig = Figure(figsize=(4.6 * len(columns) + 3.2, 3.6 * len(workloads)), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(len(workloads), len(columns), squeeze=False)
    for workload, column, group in panels:
        ax = grid[workloads.index(workload)][columns.index(column)]
        labels = variant_labels(group)
        for color, i in zip(colors(len(group)), group.index, strict=True):
            ev = run_evals(group.at[i, "run_dir"])
            if not len(ev):
                continue
            ax.plot(x(ev, group.loc[i]), ev["eval_loss"], marker="o", markersize=2.5, color=color,
                    label=labels[i])
        optimum = group["eval_loss_optimum"].dropna() if "eval_loss_optimum" in group else pd.Series(dtype=float)
        if len(optimum):
            known = " (the language's entropy)" if workload == "transformer" else ""  # synthetic: 0
            ax.axhline(float(optimum.iloc[0]), color="black", linestyle=":", linewidth=1,
                       label=f"best achievable{known}")
        target = group["target_loss"].dropna() if "target_loss" in group else pd.Series(dtype=float)
        if len(target):
            ax.axhline(float(target.iloc[0]), color="grey", linestyle="--", linewidth=1, label="target")
        ax.set_title(f"{workload}: {column}", fontsize="medium")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out loss")
        ax.grid(alpha=0.3)
        if columns.index(column) == len(columns) - 1:  # one legend a row, beside its last panel
            ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle(title)
    return fig


def convergence_vs_time(table: pd.DataFrame) -> Figure:
    return _curves(table, lambda ev, _row: ev["train_s"], "training wall time (s)",
                   "Held-out loss vs wall time (time to accuracy)")


def convergence_vs_samples(table: pd.DataFrame) -> Figure:
    def batches(ev: pd.DataFrame, row: pd.Series) -> pd.Series:
        return ev["samples_seen"] / (row["workers"] * row["workload.batch_size"])

    return _curves(table, batches, "samples seen (global batches of N x batch size)",
                   "Held-out loss vs samples (statistical efficiency)")


def time_to_target_table(table: pd.DataFrame) -> str:
    """Markdown: one row per run, grouped by setting, fastest to the target first."""
    rows = _completed(table)
    lines = ["| setting | variant | time to target (s) | updates | samples | held-out loss (last) | "
             "accuracy (last) | samples/s |", "|---|---|---|---|---|---|---|---|"]
    for workload, column, group in settings(rows):
        name = f"{workload}, {column}"
        labels = variant_labels(group)
        # as numbers first: a column of only "not reached" (None) is an object column, whose
        # fillna pandas 2.2 warns about on stderr
        reached = pd.to_numeric(group["time_to_target_s"], errors="coerce")
        order = group.assign(_t=reached.fillna(np.inf)).sort_values("_t", kind="stable")
        for i in order.index:
            r = group.loc[i]
            acc = r.get("eval_acc_last")
            lines.append(f"| {name} | {labels[i]} | {_num(r, 'time_to_target_s')} | "
                         f"{_num(r, 'updates_to_target', '{:.0f}')} | "
                         f"{_num(r, 'samples_to_target', '{:.0f}')} | {r['eval_loss_last']:.3f} | "
                         f"{'-' if acc is None or pd.isna(acc) else f'{acc:.3f}'} | {r['samples_per_s']:.0f} |")
    return "\n".join(lines)


def _num(row: pd.Series, key: str, pattern: str = "{:.1f}") -> str:
    v = row.get(key)
    return "not reached" if v is None or pd.isna(v) else pattern.format(v)


def write_table(table: pd.DataFrame, out_dir: str | Path) -> Path | None:
    """time_to_target.md beside the figures (None when no run was evaluated)."""
    try:
        text = time_to_target_table(table)
    except NoData:
        return None
    path = Path(out_dir) / "time_to_target.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return path
