"""One map from a validated grid: predict, rank, check, write (the command's body)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from testbed.config import ConfigError, RunConfig, WorkloadConfig
from testbed.map import accuracy, figure, rank, report, spotchecks, table
from testbed.map.grid import CALIBRATED, Grid

RANKED_BY = ("predicted step time (compute + the cost model's communication) among the configurations "
             "whose update is the synchronous minibatch step")
RANKED_BY_TARGET = ("predicted time to held-out loss {loss:g}: the step time (compute + the cost model's "
                    "communication) times, for the stale or averaged-model updates, their samples to that loss "
                    "over the synchronous step's (measured on {workload} at N = {n}, below)")


def build(grid: Grid, out: Path, quiet: bool, command: str) -> int:
    out.mkdir(parents=True, exist_ok=True)
    preds = table.predictions(grid, progress=not quiet)
    measured, ref_label = None, None
    if grid.target_loss is not None:
        measured, ref_label = _measure_accuracy(grid, preds, out, quiet)
    sync_cells = rank.rank(accuracy.apply(preds, None))[1] if measured is not None else None
    preds = accuracy.apply(preds, measured)
    rows, cells = rank.rank(preds)
    chosen, left, todo = _plan_checks(grid, rows, cells, out)
    records = spotchecks.run_checks(todo, out, quiet) if todo else {}
    checked = _checked(chosen, todo, records)
    rows = _merge(rows, cells, checked)
    rows.to_parquet(out / "map.parquet", index=False)
    title = f"When does a parameter server win? {grid.workload}, {grid.compute_ms:g} ms compute"
    notes = _not_ranked(rows)
    ranked_by = RANKED_BY if grid.target_loss is None else RANKED_BY_TARGET.format(
        loss=grid.target_loss, workload=grid.accuracy_workload, n=accuracy.ACC_WORKERS)
    selection = {"asked": grid.check_cells, "chosen": len(chosen), "left": left}
    acc = accuracy.section(grid.target_loss, grid.accuracy_workload, measured, ref_label) + _bounds(rows)
    (out / "map.md").write_text(report.markdown(title, command, cells, rows, checked, ranked_by, notes,
                                                selection=selection, accuracy=acc, sync_cells=sync_cells))
    figure.save(figure.draw(cells, checked, grid.workload), out)
    off = checked[checked["verdict"] != "ok"] if len(checked) else checked
    if not quiet:
        print(f"testbed.map: {len(cells)} cells, {len(rows)} predictions, {len(checked)} check runs "
              f"({len(off)} off)")
    print(out)
    return 1 if len(off) else 0


def _measure_accuracy(grid: Grid, preds: pd.DataFrame, out: Path, quiet: bool) -> tuple[dict[str, dict[str, Any]], str]:
    """The samples-to-target factor of every kind of stale update, from one run each and one of
    the synchronous reference (testbed.map.accuracy)."""
    _, cells = rank.rank(accuracy.apply(preds, None))
    ref = accuracy.reference(cells, preds)
    base = RunConfig(workload=WorkloadConfig(name=grid.accuracy_workload), quiet=True)
    runs, refused = out / "accuracy_runs", {}
    todo = {"reference": accuracy.run_config(base, ref["strategy"], ref["overrides"], grid.target_loss, True, runs)}
    for _, k in accuracy.kinds(preds).iterrows():
        try:
            todo[k["kind"]] = accuracy.run_config(base, k["strategy"], k["overrides"], grid.target_loss, False, runs,
                                                  per_gradient=bool(k["per_gradient"]))
        except ConfigError as exc:
            refused[k["kind"]] = {"status": "refused", "error": f"at N = {accuracy.ACC_WORKERS}: {exc}"}
    records = accuracy.run(todo, out, quiet)
    return accuracy.factors({**records, **refused}), str(ref["label"])


def _plan_checks(grid: Grid, rows: pd.DataFrame, cells: pd.DataFrame,
                 out: Path) -> tuple[pd.DataFrame, dict[str, int], list[dict[str, Any]]]:
    """The cells to check, why others cannot be, and one run per configuration chosen in them."""
    if grid.check_cells == 0:
        return cells.iloc[0:0].assign(chosen=None, runs=None), {}, []
    configs: dict[tuple, Any] = {}

    def config(cell: pd.Series, label: str) -> Any:
        key = (cell["latency"], cell["bandwidth"], int(cell["workers"]), label)
        if key not in configs:
            row = rows[(rows["latency"] == key[0]) & (rows["bandwidth"] == key[1]) & (rows["workers"] == key[2])
                       & (rows["label"] == label)].iloc[0]
            configs[key] = (row, table.config_of(grid, row))
        return configs[key]

    def pairs(cell: pd.Series) -> Any:
        if cell["bandwidth"] == CALIBRATED:
            return "the calibrated network is this machine's own: nothing to emulate"
        if cell["runner_up"] is None:
            return "fewer than two configurations ranked"
        if int(cell["workers"]) > spotchecks.MAX_WORKERS:
            return f"more than {spotchecks.MAX_WORKERS} workers, too slow to run here"
        ranked = rows[(rows["latency"] == cell["latency"]) & (rows["bandwidth"] == cell["bandwidth"])
                      & (rows["workers"] == cell["workers"]) & rows["rank"].notna()].sort_values(["rank", "label"])
        top = (cell["winner"], cell["runner_up"])
        whys = {label: spotchecks.why_not(config(cell, label)[1]) for label in top}
        if not any(whys.values()):
            return top, None
        note = "; ".join(f"{label} needs {why}" for label, why in whys.items() if why)
        found = []
        for label in ranked["label"]:
            if spotchecks.why_not(config(cell, label)[1]) is None:
                found.append(label)
                if len(found) == 2:
                    return tuple(found), note
        return note

    chosen, left = spotchecks.select(cells, grid.check_cells, pairs)
    todo = []
    for _, cell in chosen.iterrows():
        for label in cell["runs"]:
            row, cfg = config(cell, label)
            probe = spotchecks.check_config(cfg, float(row["predicted_step_s"]), float(row["grad_bytes_logical"]), out / "runs")
            todo.append({"key": spotchecks.config_key(probe), "cfg": cfg, "label": label, "chosen": cell["chosen"],
                         "latency": cell["latency"], "bandwidth": cell["bandwidth"], "workers": int(cell["workers"]),
                         "predicted_step_s": float(row["predicted_step_s"]),
                         "k_bytes": float(row["grad_bytes_logical"])})
    return chosen, left, todo


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
    stale = rows[~rows["exact"].astype(bool) & rows["score_s"].isna() & rows["predicted_step_s"].notna()]
    if len(stale):
        labels = list(dict.fromkeys(stale["label"]))
        notes.append("Stale or averaged-model updates without a measured samples-to-target factor, whose step times "
                     "do not compare with a synchronous step's (each needs more samples to reach a loss): their "
                     "predicted step times are in map.parquet, not ranked "
                     f"({len(labels)} configurations: {', '.join(labels[:6])}{', ...' if len(labels) > 6 else ''}).")
    for label, group in rows[rows["note"].notna()].groupby("label", sort=False):
        notes.append(f"{label}: {group['note'].iloc[0]}")
    return notes or ["Every configuration was ranked."]


def _bounds(rows: pd.DataFrame) -> list[str]:
    """A caveat where a cell's winner is predicted by a lower bound (no contention)."""
    bound = rows[rows["is_winner"] & rows["formula"].fillna("").str.contains("lower bound")]
    if bound.empty:
        return []
    labels = list(dict.fromkeys(bound["label"]))
    cells = f"{len(bound)} cell{'s are' if len(bound) != 1 else ' is'}"
    return [f"{cells} won by a configuration whose predicted step is its model's lower bound (no contention at "
            f"the servers; {', '.join(labels)}): there the margin is optimistic, and a check run says by how much.", ""]
