"""The parameter-server placement figure: communication per step against the number of servers k.

One panel per (workers, bandwidth). For each PS setting (placement, partitions on or off) the measured
communication per step (points, mean and spread over repeats) and the cost model's prediction for
that run (line); every serverless strategy in the table (the ring) as horizontal lines, measured
and predicted; and the
BytePS bound t_opt(k) = 2n(n-1)K / ((n^2 + kn - 2k) B) (`psmodel.byteps_optimal_comm_s`), the
least any assignment of gradient bytes to n workers' and k spare servers' NICs can take. Where the
dedicated points fall below the ring line the PS wins on bandwidth; colocated servers share their
workers' NICs and land on the ring's line instead. Pure: reads a sweep table.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from testbed.analysis.figures import NoData, colors, legend, new_figure
from testbed.analysis.psmodel import byteps_optimal_comm_s
from testbed.util import units


def _setting(row: pd.Series) -> str:
    placement = row.get("ps.placement", "dedicated")
    mb = row.get("ps.partition_mb", 0.0)
    parts = "partitions off" if not mb else f"{mb:g} MiB partitions"
    return f"{row['strategy']} {placement}, {parts}"


def placement_figure(table: pd.DataFrame) -> Figure:
    """Communication per step vs servers k (see the module docstring); NoData without PS rows
    at two or more k on an emulated network."""
    need = ["comm_s_per_step", "predicted_comm_s", "network.bandwidth", "grad_bytes_logical", "workers"]
    missing = [c for c in need + ["ps_shards"] if c not in table.columns]
    if missing:
        raise NoData(f"table has no column {', '.join(missing)}")
    rows = table[table["status"] == "completed"] if "status" in table.columns else table
    rows = rows.dropna(subset=need)
    ps = rows.dropna(subset=["ps_shards"])  # runs with servers (the parameter server's summary key)
    if ps["ps_shards"].nunique() < 2:
        raise NoData("the placement figure needs parameter-server runs at two or more server counts")
    panels = sorted({(int(n), bw) for n, bw in zip(ps["workers"], ps["network.bandwidth"], strict=True)},
                    key=lambda p: (p[0], units.parse_bandwidth(p[1])))
    fig, axes = new_figure(len(panels), width=6.0)
    for ax, (n, bw) in zip(axes, panels, strict=True):  # one panel per (N, bandwidth)
        here = ps[(ps["workers"] == n) & (ps["network.bandwidth"] == bw)]
        here = here.assign(_setting=here.apply(_setting, axis=1))
        settings = list(dict.fromkeys(here["_setting"]))
        for color, setting in zip(colors(len(settings)), settings, strict=True):
            group = here[here["_setting"] == setting].groupby("ps_shards")
            meas, pred = group["comm_s_per_step"].agg(["mean", "std"]).fillna(0.0), group["predicted_comm_s"].mean()
            ax.errorbar(meas.index, 1e3 * meas["mean"], yerr=1e3 * meas["std"], fmt="o", color=color,
                        label=f"{setting} (measured)", capsize=3)
            ax.plot(pred.index, 1e3 * pred.to_numpy(), "_-", color=color, alpha=0.6, markersize=14,
                    label=f"{setting} (model)")
        k_bytes = float(here["grad_bytes_logical"].iloc[0])
        b = units.parse_bandwidth(bw)
        ks = list(range(1, int(here["ps_shards"].max()) + 1))
        ax.plot(ks, [1e3 * byteps_optimal_comm_s(n, k, k_bytes, b) for k in ks], ":", color="black",
                label="BytePS bound t_opt(k)")
        others = rows[rows["ps_shards"].isna() & (rows["network.bandwidth"] == bw) & (rows["workers"] == n)]
        for name, other in others.groupby("strategy"):  # serverless strategies: one line each
            ax.axhline(1e3 * other["comm_s_per_step"].mean(), color="gray", ls="--", label=f"{name} (measured)")
            ax.axhline(1e3 * other["predicted_comm_s"].mean(), color="gray", ls="-", alpha=0.4,
                       label=f"{name} (model)")
        ax.set_xlabel("parameter servers k")
        ax.set_ylabel("communication per step (ms)")
        ax.set_yscale("log")  # k = 1 is N times k = N; the region near the ring is what matters
        ax.grid(alpha=0.3)
        ax.set_title(f"Where the servers sit: N={n}, K={k_bytes / 2**20:g} MiB, {bw}")
        legend(ax)
    return fig
