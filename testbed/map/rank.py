"""The ranking: a pure function of the predictions table.

Within each cell (latency, bandwidth, workers) the configurations with a score (`score_s`, the
time to compare: the predicted step time, or the time to a target loss where that is known) are
sorted by score, then by label, so that the order is the same on every run. Equal scores share
a rank (a tie: the cell's margin is 0 and `tied` says so). Per cell:

    winner              the first configuration
    runner_up           the second (the winner's equal, in a tie)
    margin_runner_up    runner_up / winner - 1: how much slower the next best is
    other               the best configuration of another family than the winner's (the parameter
                        server against the allreduce, and the others against both)
    margin_other        other / winner - 1
    efficiency          compute / predicted step: the share of the ideal N-fold speed-up a
                        configuration keeps (1: communication costs nothing)

Rows without a score (not modelled, refused, or stale updates ranked only by time to accuracy)
keep rank NaN and are listed, not ranked.
"""

from __future__ import annotations

import math

import pandas as pd

CELL = ["latency", "bandwidth", "workers"]
TIE_REL = 1e-9  # scores this close are equal: the same formula evaluated on different paths


def rank(table: pd.DataFrame, score: str = "score_s") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows with `rank` and `efficiency`, one row per cell with winner, runner-up and margins)."""
    rows = table.copy()
    rows["efficiency"] = rows["compute_s"].astype(float) / rows["predicted_step_s"].astype(float)
    rows["rank"] = float("nan")
    cells = []
    for key, group in rows.groupby(CELL, sort=False):
        ranked = group[group[score].notna()].sort_values([score, "label"], kind="stable")
        ranks, last, r = [], None, 0
        for i, value in enumerate(ranked[score].astype(float)):
            if last is None or not _equal(value, last):
                r, last = i + 1, value
            ranks.append(r)
        rows.loc[ranked.index, "rank"] = ranks
        cells.append(_cell(dict(zip(CELL, key, strict=True)), ranked, score))
    return rows, pd.DataFrame(cells)


def _equal(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=TIE_REL, abs_tol=0.0)


def _cell(key: dict, ranked: pd.DataFrame, score: str) -> dict:
    out = {**key, "winner": None, "winner_strategy": None, "winner_family": None, "winner_s": None,
           "runner_up": None, "runner_up_s": None, "margin_runner_up": None, "tied": False,
           "other": None, "other_family": None, "other_s": None, "margin_other": None}
    if ranked.empty:
        return out
    first = ranked.iloc[0]
    best = float(first[score])
    out.update(winner=first["label"], winner_strategy=first["strategy"], winner_family=first["family"],
               winner_s=best)
    if len(ranked) > 1:
        second = ranked.iloc[1]
        out.update(runner_up=second["label"], runner_up_s=float(second[score]),
                   margin_runner_up=_margin(float(second[score]), best), tied=_equal(float(second[score]), best))
    others = ranked[ranked["family"] != first["family"]]
    if not others.empty:
        o = others.iloc[0]
        out.update(other=o["label"], other_family=o["family"], other_s=float(o[score]),
                   margin_other=_margin(float(o[score]), best))
    return out


def _margin(slower: float, best: float) -> float:
    if _equal(slower, best):
        return 0.0
    return slower / best - 1 if best > 0 else math.inf
