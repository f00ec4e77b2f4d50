"""One map from a validated grid: predict, rank, check, write (the command's body)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from testbed.map import checks, figure, rank, report, table
from testbed.map.grid import CALIBRATED, Grid

RANKED_BY = ("predicted step time (compute + the cost model's communication) among the configurations "
             "whose update is the synchronous minibatch step")


def build(grid: Grid, out: Path, quiet: bool, command: str) -> int:
    out.mkdir(parents=True, exist_ok=True)
    preds = table.predictions(grid, progress=not quiet)
    preds["score_s"] = preds["predicted_step_s"].where(preds["exact"].astype(bool))
    rows, cells = rank.rank(preds)
    chosen, todo = _plan_checks(grid, rows, cells, out)
    records = checks.run_checks(todo, out, quiet) if todo else {}
    checked = _checked(chosen, todo, records)
    rows = _merge(rows, cells, checked)
    rows.to_parquet(out / "map.parquet", index=False)
    title = f"When does a parameter server win? {grid.workload}, {grid.compute_ms:g} ms compute"
    notes = _not_ranked(rows)
    (out / "map.md").write_text(report.markdown(title, command, cells, rows, checked, RANKED_BY, notes))
    figure.save(figure.draw(cells, checked, grid.workload), out)
    off = checked[checked["verdict"] != "ok"] if len(checked) else checked
    if not quiet:
        print(f"testbed.map: {len(cells)} cells, {len(rows)} predictions, {len(checked)} check runs "
              f"({len(off)} off)")
    print(out)
    return 1 if len(off) else 0


def _plan_checks(grid: Grid, rows: pd.DataFrame, cells: pd.DataFrame, out: Path) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """The cells to check, and one run per winner and runner-up in them."""
    if grid.check_cells == 0:
        return cells.iloc[0:0].assign(chosen=None), []
    configs: dict[tuple, Any] = {}

    def config(cell: pd.Series, label: str) -> Any:
        key = (cell["latency"], cell["bandwidth"], int(cell["workers"]), label)
        if key not in configs:
            row = rows[(rows["latency"] == key[0]) & (rows["bandwidth"] == key[1]) & (rows["workers"] == key[2])
                       & (rows["label"] == label)].iloc[0]
            configs[key] = (row, table.config_of(grid, row))
        return configs[key]

    def hostable(cell: pd.Series) -> bool:
        if cell["bandwidth"] == CALIBRATED or cell["runner_up"] is None:
            return False  # the real network is this machine's; nothing to emulate
        return all(checks.hostable(config(cell, lab)[1]) for lab in (cell["winner"], cell["runner_up"]))

    chosen = checks.select(cells, grid.check_cells, hostable)
    todo = []
    for _, cell in chosen.iterrows():
        for label in (cell["winner"], cell["runner_up"]):
            row, cfg = config(cell, label)
            probe = checks.check_config(cfg, float(row["predicted_step_s"]), float(row["grad_bytes_logical"]), out / "runs")
            todo.append({"key": checks.config_key(probe), "cfg": cfg, "label": label, "chosen": cell["chosen"],
                         "latency": cell["latency"], "bandwidth": cell["bandwidth"], "workers": int(cell["workers"]),
                         "predicted_step_s": float(row["predicted_step_s"]),
                         "k_bytes": float(row["grad_bytes_logical"])})
    return chosen, todo


def _checked(chosen: pd.DataFrame, todo: list[dict[str, Any]], records: dict[str, dict[str, Any]]) -> pd.DataFrame:
    cols = ["latency", "bandwidth", "workers", "chosen", "label", "predicted_step_s", "measured_step_s", "ratio",
            "dilation", "verdict", "reason", "run_dir", "tries"]
    out = []
    for t in todo:
        rec = records.get(t["key"], {})
        out.append({**{c: rec.get(c) for c in cols}, "chosen": t["chosen"], "label": t["label"],
                    "latency": t["latency"], "bandwidth": t["bandwidth"], "workers": t["workers"],
                    "predicted_step_s": t["predicted_step_s"], "verdict": rec.get("verdict", "off"),
                    "reason": rec.get("reason") or (None if rec else "not run")})
    return pd.DataFrame(out, columns=cols)


def _merge(rows: pd.DataFrame, cells: pd.DataFrame, checked: pd.DataFrame) -> pd.DataFrame:
    keep = ["winner", "runner_up", "margin_runner_up", "tied", "other", "margin_other"]
    merged = rows.merge(cells[rank.CELL + keep], on=rank.CELL, how="left")
    merged["is_winner"] = merged["label"] == merged["winner"]
    if len(checked):
        c = checked[rank.CELL + ["label", "measured_step_s", "ratio", "dilation", "verdict", "reason"]].rename(
            columns={"ratio": "measured_ratio", "dilation": "check_dilation", "verdict": "check_verdict",
                     "reason": "check_reason"})
        merged = merged.merge(c, on=[*rank.CELL, "label"], how="left")
    else:
        for col in ("measured_step_s", "measured_ratio", "check_dilation", "check_verdict", "check_reason"):
            merged[col] = None
    for col in ("overrides", "formula", "note", "check_verdict", "check_reason", "winner", "runner_up", "other"):
        merged[col] = merged[col].astype("string")
    return merged


def _not_ranked(rows: pd.DataFrame) -> list[str]:
    notes = []
    stale = rows[~rows["exact"].astype(bool)]
    if len(stale):
        labels = list(dict.fromkeys(stale["label"]))
        notes.append("Stale or averaged-model updates, whose step times do not compare with a synchronous step's "
                     "(each needs more samples to reach a loss): their predicted step times are in map.parquet, "
                     f"not ranked ({len(labels)} configurations: {', '.join(labels[:6])}{', ...' if len(labels) > 6 else ''}).")
    for label, group in rows[rows["note"].notna()].groupby("label", sort=False):
        notes.append(f"{label}: {group['note'].iloc[0]}")
    return notes or ["Every configuration was ranked."]


