"""map.md: the answer in sentences, the checks beside it, and what was not ranked. Pure.

Per panel (latency) and bandwidth, consecutive worker counts with the same winner form one
sentence: "at 10Gbit, up to N = 16 X wins by 2-3% over its runner-up and by 15-22% over the best
of another family (Y); from N = 32, Z ...".
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from testbed.util import units


def _pct(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{100 * lo:.0f}%" if round(100 * lo) == round(100 * hi) else f"{100 * lo:.0f}-{100 * hi:.0f}%"


def _names(labels: Any) -> list[str]:
    """The distinct labels, most frequent first, at most two and "..." (sentences stay short)."""
    counts = pd.Series([x for x in labels if x is not None]).value_counts(sort=True)
    names = list(counts.index[:2])
    return names + (["..."] if len(counts) > 2 else [])


def segments(row: pd.DataFrame) -> list[dict[str, Any]]:
    """Runs of consecutive worker counts (sorted) with one winner."""
    out: list[dict[str, Any]] = []
    for _, c in row.sort_values("workers").iterrows():
        if out and out[-1]["winner"] == c["winner"]:
            out[-1]["cells"].append(c)
        else:
            out.append({"winner": c["winner"], "cells": [c]})
    return out


def sentence(bandwidth: str, latency: str, row: pd.DataFrame) -> str:
    parts = []
    segs = segments(row)
    for i, seg in enumerate(segs):
        ns = [int(c["workers"]) for c in seg["cells"]]
        if len(segs) == 1:
            where = "at every N"
        elif len(ns) == 1:
            where = f"at N = {ns[0]}"
        elif i == 0:
            where = f"up to N = {ns[-1]}"
        elif i == len(segs) - 1:
            where = f"from N = {ns[0]} on"
        else:
            where = f"from N = {ns[0]} to {ns[-1]}"
        if seg["winner"] is None:
            parts.append(f"{where} nothing is ranked")
            continue
        text = f"{where} **{seg['winner']}** wins"
        runner = [c["margin_runner_up"] for c in seg["cells"] if c["margin_runner_up"] is not None]
        if runner:
            ups = _names(c["runner_up"] for c in seg["cells"])
            tied = any(c["tied"] for c in seg["cells"])
            text += f" by {_pct(runner)} over its runner-up ({', '.join(ups)}{'; tied' if tied else ''})"
        other = [c for c in seg["cells"] if c["margin_other"] is not None]
        if other:
            names = _names(c["other"] for c in other)
            text += f" and by {_pct([c['margin_other'] for c in other])} over the best of another family ({', '.join(names)})"
        parts.append(text)
    return f"- At {bandwidth} ({latency}): " + "; ".join(parts) + "."


def selection_text(selection: dict[str, Any]) -> str:
    """How many cells were asked, how many are checked, and why any were left out."""
    asked, chosen, left = selection["asked"], selection["chosen"], selection.get("left") or {}
    text = f"{asked} cells asked (`--check-cells {asked}`), {chosen} checked."
    if chosen < asked:
        why = "; ".join(f"{n} cell{'s' if n != 1 else ''}: {reason}" for reason, n in left.items())
        text += f" {asked - chosen} left out: no other cell can run here" + (f" ({why})." if why else ".")
    return text


def markdown(title: str, command: str, cells: pd.DataFrame, rows: pd.DataFrame, checks: pd.DataFrame,
             ranked_by: str, notes: list[str], selection: dict[str, Any] | None = None,
             accuracy: list[str] | None = None, sync_cells: pd.DataFrame | None = None) -> str:
    lines = [f"# {title}", "", "```", command, "```", "",
             f"Ranked by {ranked_by}. Margins: how much slower the runner-up, and the best configuration of "
             "another family, are than the winner (predicted).", ""]
    if accuracy:
        lines += ["## Time to accuracy", "", *accuracy]
    lines += _panels(cells, "")
    if sync_cells is not None:
        lines += ["## Synchronous steps alone", "",
                  "The same cells ranked among the configurations whose update is the synchronous minibatch step "
                  "(the ranking without `--target-loss`), where every prediction is the model's expected step:", ""]
        lines += _panels(sync_cells, "#")
    lines += ["## Checks", ""]
    if checks.empty:
        lines += [selection_text(selection) if selection and selection["asked"] else
                  "No cell was run (`--check-cells 0`).", ""]
    else:
        lines += [*([selection_text(selection), ""] if selection else []),
                  "Each checked cell's winner and runner-up ran as an emulated experiment (the code path of "
                  "`testbed.run`; in a fill cell, the two best configurations that can run here): measured step "
                  "beside predicted, the dilation it ran at, and the verdict (ok: faithful and within the "
                  "tolerance).", "",
                  "| latency | bandwidth | N | why chosen | configuration | predicted (s) | measured (s) | ratio | dilation | verdict |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for _, c in checks.iterrows():
            meas = "" if c["measured_step_s"] is None or pd.isna(c["measured_step_s"]) else f"{c['measured_step_s']:.4g}"
            ratio = "" if c["ratio"] is None or pd.isna(c["ratio"]) else f"{c['ratio']:.3f}"
            verdict = c["verdict"] + (f": {c['reason']}" if c["verdict"] != "ok" and c["reason"] else "")
            lines.append(f"| {c['latency']} | {c['bandwidth']} | {c['workers']} | {c['chosen']} | {c['label']} | "
                         f"{c['predicted_step_s']:.4g} | {meas} | {ratio} | {c['dilation']:g} | {verdict} |")
        lines.append("")
    lines += ["## Not ranked", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def _panels(cells: pd.DataFrame, deeper: str) -> list[str]:
    lines = []
    for latency, panel in cells.groupby("latency", sort=False):
        lines.append(f"##{deeper} Latency {latency}" if latency != "calibrated" else f"##{deeper} The calibrated network")
        lines.append("")
        for bw in sorted(panel["bandwidth"].unique(), key=_bw_key):
            lines.append(sentence(bw, latency, panel[panel["bandwidth"] == bw]))
        lines.append("")
    return lines


def _bw_key(bw: str) -> float:
    try:
        return units.parse_bandwidth(bw)
    except ValueError:
        return float("inf")


def answer_table(rows: pd.DataFrame, latency: str | None = None) -> str:
    """The winner per cell as a markdown table, bandwidths down, worker counts across: each cell
    the winner and its margin over the best of another family (from map.parquet's rows; the
    first latency unless one is named)."""
    cells = rows[rows["label"] == rows["winner"]].drop_duplicates(["latency", "bandwidth", "workers"])
    latency = latency if latency is not None else cells["latency"].iloc[0]
    cells = cells[cells["latency"] == latency]
    ns = sorted(int(n) for n in cells["workers"].unique())
    lines = [f"| bandwidth ({latency}) | " + " | ".join(f"N = {n}" for n in ns) + " |",
             "|---|" + "---|" * len(ns)]
    for bw in sorted(cells["bandwidth"].unique(), key=_bw_key):
        at = {int(c["workers"]): c for _, c in cells[cells["bandwidth"] == bw].iterrows()}
        out = []
        for n in ns:
            c = at.get(n)
            if c is None:
                out.append("")
                continue
            m = c["margin_other"]
            out.append(f"{c['winner']}" + ("" if m is None or pd.isna(m) else f" (+{100 * m:.0f}% {c['other']})"))
        lines.append(f"| {bw} | " + " | ".join(out) + " |")
    return "\n".join(lines)
