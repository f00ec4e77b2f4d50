"""A small map end to end: 2 x 2 cells, one checked cell (its winner and runner-up run through
session.execute), the four files written, the check reused on a rerun."""

import pandas as pd

from testbed.map import checks
from testbed.map.__main__ import main

ARGS = ["--workload", "profile:resnet50", "--workers", "2,4", "--bandwidth", "1Gbit,10Gbit",
        "--compute-ms", "20", "--check-cells", "1", "--quiet"]


def test_a_small_map_with_one_checked_cell(tmp_path, monkeypatch):
    monkeypatch.setattr(checks, "REAL_STEP_S", 0.3)  # a short dilated step: the test checks the path, not a timing
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
    lines = (out / "checks.jsonl").read_text().splitlines()
    assert main([*ARGS, "--out", str(out)]) == code  # the rerun reuses the checks: no new run
    assert (out / "checks.jsonl").read_text().splitlines() == lines
