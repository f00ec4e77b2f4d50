"""map.png / map.svg: the winner per cell as a coloured grid, one panel per latency.

Rows are bandwidths, columns worker counts; a cell's colour is its winner's strategy, its text
the winner and its margin over the runner-up (and over the best of another family). Thick black
lines run between cells whose winners are of different families (the crossover lines). A
checked cell has a green frame when its runs matched the prediction and a red one, with "!",
when they did not.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from testbed.analysis.figures import colors
from testbed.map.report import _bw_key


def draw(cells: pd.DataFrame, checked: pd.DataFrame, title: str) -> Figure:
    panels = list(dict.fromkeys(cells["latency"]))
    ns = sorted(cells["workers"].unique())
    strategies = sorted({s for s in cells["winner_strategy"] if s is not None})
    palette = dict(zip(strategies, colors(max(1, len(strategies))), strict=False))
    rows_max = max(cells[cells["latency"] == p]["bandwidth"].nunique() for p in panels)
    fig = Figure(figsize=(1.9 * len(ns) + 1.5, (1.0 * rows_max + 1.2) * len(panels)))
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, latency in zip(axes, panels, strict=True):
        panel = cells[cells["latency"] == latency]
        bws = sorted(panel["bandwidth"].unique(), key=_bw_key)
        at = {(b, n): c for _, c in panel.iterrows() for b, n in [(c["bandwidth"], c["workers"])]}
        for i, bw in enumerate(bws):
            for j, n in enumerate(ns):
                c = at.get((bw, n))
                if c is None or c["winner"] is None:
                    continue
                ax.add_patch(Rectangle((j, i), 1, 1, color=palette[c["winner_strategy"]], alpha=0.55))
                text = _short(c["winner"])
                if c["margin_runner_up"] is not None:
                    text += f"\n+{100 * c['margin_runner_up']:.0f}% runner-up"
                if c["margin_other"] is not None:
                    text += f"\n+{100 * c['margin_other']:.0f}% other family"
                ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=6.5)
                here = checked[(checked["latency"] == latency) & (checked["bandwidth"] == bw) & (checked["workers"] == n)]
                if len(here):
                    ok = bool((here["verdict"] == "ok").all())
                    ax.add_patch(Rectangle((j + 0.04, i + 0.04), 0.92, 0.92, fill=False, lw=2.5,
                                           edgecolor="green" if ok else "red"))
                    if not ok:
                        ax.text(j + 0.9, i + 0.85, "!", color="red", fontsize=12, weight="bold", ha="center", va="center")
                for di, dj in ((1, 0), (0, 1)):  # a crossover: a neighbour's winner is of another family
                    nb = at.get((bws[i + di], n)) if di and i + 1 < len(bws) else (
                        at.get((bw, ns[j + dj])) if dj and j + 1 < len(ns) else None)
                    if nb is not None and nb["winner_family"] is not None and nb["winner_family"] != c["winner_family"]:
                        xs, ys = ([j, j + 1], [i + 1, i + 1]) if di else ([j + 1, j + 1], [i, i + 1])
                        ax.plot(xs, ys, color="black", lw=3)
        ax.set_xlim(0, len(ns))
        ax.set_ylim(0, len(bws))
        ax.set_xticks([j + 0.5 for j in range(len(ns))], [str(n) for n in ns])
        ax.set_yticks([i + 0.5 for i in range(len(bws))], bws)
        ax.set_xlabel("workers N")
        ax.set_ylabel("bandwidth")
        ax.set_title(f"{title}, latency {latency}", fontsize=9)
    handles = [Rectangle((0, 0), 1, 1, color=palette[s], alpha=0.55) for s in strategies]
    fig.legend(handles, strategies, loc="lower center", ncol=max(1, len(strategies)), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def _short(label: str) -> str:
    """A label on two lines where it has a comma (they are long)."""
    return label.replace(", ", "\n", 1)


def save(fig: Figure, out_dir: Path) -> None:
    fig.savefig(out_dir / "map.png", dpi=110)
    fig.savefig(out_dir / "map.svg")
