"""A small map end to end: 2 x 2 cells, one checked cell (its winner and runner-up run through
session.execute), the four files written, the check reused on a rerun; and time to accuracy:
one stale kind's samples to a target against the synchronous reference's, reused on a rerun."""

import json

import pandas as pd
import pytest

from testbed.map import accuracy, spotchecks
from testbed.map.__main__ import main

ARGS = ["--workload", "profile:resnet50", "--workers", "2,4", "--bandwidth", "1Gbit,10Gbit",
        "--compute-ms", "20", "--check-cells", "1", "--quiet"]


def test_a_small_map_with_one_checked_cell(tmp_path, monkeypatch):
    monkeypatch.setattr(spotchecks, "REAL_STEP_S", 0.3)  # a short dilated step: the test checks the path, not a timing
    monkeypatch.setattr(spotchecks, "CHECK_BUDGET_S", 6.0)  # and a short search
    out = tmp_path / "map"
    code = main([*ARGS, "--out", str(out)])
    for name in ("map.parquet", "map.md", "map.png", "map.svg", "checks.jsonl"):
        assert (out / name).stat().st_size > 0, name
    rows = pd.read_parquet(out / "map.parquet")
    cells = rows.drop_duplicates(["latency", "bandwidth", "workers"])
    assert len(cells) == 4
    checked = rows[rows["check_verdict"].notna()]
    assert len(checked) == 2  # the winner and the runner-up of one cell
    assert set(checked["label"]) == {checked["winner"].iloc[0], checked["runner_up"].iloc[0]}
    assert checked["measured_step_s"].notna().all()
    text = (out / "map.md").read_text()
    for _, row in checked.iterrows():  # every check is in the report, off ones with their reason
        assert row["label"] in text
        if row["check_verdict"] != "ok":
            assert row["check_reason"] and row["check_reason"] in text
    assert code == (0 if (checked["check_verdict"] == "ok").all() else 1)
    for rec in map(json.loads, (out / "checks.jsonl").read_text().splitlines()):  # the search's trials, kept
        assert rec["tries"] and rec["tries"][0]["dilation"] == spotchecks.dilation_for(rec["predicted_step_s"])
        assert rec["dilation"] == rec["tries"][-1]["dilation"]
    lines = (out / "checks.jsonl").read_text().splitlines()
    assert main([*ARGS, "--out", str(out)]) == code  # the rerun reuses the checks: no new run
    assert (out / "checks.jsonl").read_text().splitlines() == lines


def test_time_to_accuracy_ranks_a_stale_kind_by_its_measured_factor(tmp_path, monkeypatch):
    """One stale kind and the synchronous reference, each one short mlp run: the factor is
    samples over the reference's, multiplies that kind's step, is in map.md with its N, and the
    rerun reuses both runs."""
    monkeypatch.setattr(accuracy, "REF_STEPS", 10)  # short runs: the test checks the path, not a value
    every = accuracy.kinds
    monkeypatch.setattr(accuracy, "kinds", lambda preds: every(preds).head(1))
    out = tmp_path / "acc"
    loss = "0.5"  # mlp's held-out loss starts near ln(classes) and passes 0.5 within a few steps at lr 0.1
    argv = ["--workload", "profile:resnet50", "--workers", "4", "--bandwidth", "1Gbit", "--compute-ms", "20",
            "--target-loss", loss, "--quiet", "--out", str(out)]
    assert main(argv) == 0
    recs = [json.loads(line) for line in (out / "accuracy.jsonl").read_text().splitlines()]
    ref, (kind,) = next(r for r in recs if r["kind"] == "reference"), [r for r in recs if r["kind"] != "reference"]
    assert len(recs) == 2 and ref["samples_to_target"], recs
    assert {r["workers"] for r in recs} == {accuracy.ACC_WORKERS} and {r["workload"] for r in recs} == {"mlp"}
    rows = pd.read_parquet(out / "map.parquet")
    mine = rows[rows["kind"] == kind["kind"]]
    text = (out / "map.md").read_text()
    assert f"held-out loss {float(loss):g}" in text and f"| {kind['kind']} | {accuracy.ACC_WORKERS} |" in text
    if kind["samples_to_target"]:
        factor = kind["samples_to_target"] / ref["samples_to_target"]
        assert (mine["accuracy_factor"] == factor).all() and mine["rank"].notna().all()
        assert mine["score_s"].to_numpy() == pytest.approx(mine["predicted_step_s"].to_numpy() * factor)
    else:  # not reached: unranked, and map.md says why
        assert mine["rank"].isna().all() and "not reached" in text
    lines = (out / "accuracy.jsonl").read_text().splitlines()
    assert main(argv) == 0 and (out / "accuracy.jsonl").read_text().splitlines() == lines
