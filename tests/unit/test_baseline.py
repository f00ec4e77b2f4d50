"""Scaling-curve regression check on literal tables: ratios, compare() passing and failing, file I/O."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from testbed.analysis import baseline
from testbed.analysis.baseline import (
    curve_ratios,
    load_baseline,
    model_ratios,
    write_baseline,
)

# Step times (s) per strategy and N, repeats 0..2: the median is the middle value.
STEP = {("ps-sync", 2): (1.0, 1.1, 5.0), ("ps-sync", 4): (1.6, 1.7, 1.8), ("ps-sync", 8): (3.0, 3.1, 2.9),
        ("ring", 2): (0.5, 0.5, 0.5), ("ring", 4): (0.75, 0.76, 0.74), ("ring", 8): (0.9, 0.9, 0.9)}
MODEL = {"ps-sync": {2: 1.0, 4: 5 / 3, 8: 3.0}, "ring": {2: 0.5, 4: 0.75, 8: 0.875}}


def table() -> pd.DataFrame:
    rows = [{"strategy": s, "workers": n, "repeat": r, "status": "completed", baseline.METRIC: t,
             "predicted_step_s": MODEL[s][n]}
            for (s, n), times in STEP.items() for r, t in enumerate(times)]
    rows.append({**rows[0], "repeat": 3, "status": "failed", baseline.METRIC: 99.0})
    return pd.DataFrame(rows)


def test_ratios_are_medians_over_repeats_of_each_repeats_ratio():
    got = curve_ratios(table())
    assert set(got) == {"ps-sync", "ring"}
    # ps-sync repeat 2 had a slow N=2 run (5.0 s): its ratios are outliers the median leaves out.
    assert got["ps-sync"] == pytest.approx({"2": 1.0, "4": 1.7 / 1.1, "8": 3.1 / 1.1})
    assert got["ring"] == pytest.approx({"2": 1.0, "4": 1.5, "8": 1.8})
    reps = baseline.repeat_ratios(table())
    assert reps["ps-sync"]["8"] == pytest.approx([3.0, 3.1 / 1.1, 2.9 / 5.0])  # the failed repeat 3 is out


def test_model_ratios():
    got = model_ratios(table())
    assert got["ps-sync"] == pytest.approx({"2": 1.0, "4": 5 / 3, "8": 3.0})
    assert got["ring"] == pytest.approx({"2": 1.0, "4": 1.5, "8": 1.75})


def test_a_table_with_another_grid_dimension_is_refused():
    t = table()
    t = pd.concat([t, t.assign(**{"ps.shards": 2})])
    with pytest.raises(ValueError, match="several runs of ps-sync at N=2"):
        curve_ratios(t)
    with pytest.raises(ValueError, match="no column"):
        curve_ratios(t.drop(columns=[baseline.METRIC]))


def test_write_and_load_round_trip(tmp_path):
    path = tmp_path / "b" / "scaling.json"
    t = table()
    t.loc[(t["strategy"] == "ps-sync") & (t["workers"] == 2) & (t["repeat"] == 2), baseline.METRIC] = 1.05
    meta = {"spec": {"name": "regression", "repeats": 1}, "provenance": {"cpu_count": 2}}
    data = write_baseline(path, t, meta)
    loaded = load_baseline(path)
    assert loaded == json.loads(json.dumps(data))
    assert loaded["schema_version"] == baseline.SCHEMA_VERSION == 2
    assert loaded["tolerance"]["floor"] == baseline.BAND_FLOOR and loaded["tolerance"]["model"] == 0.15
    assert loaded["metric"] == baseline.METRIC and loaded["spec"] == meta["spec"]
    assert loaded["ratios"]["ring"] == {"2": 1.0, "4": 1.5, "8": 1.8}
    assert loaded["model_ratios"]["ring"] == {"2": 1.0, "4": 1.5, "8": 1.75}
    assert loaded["step_time_s"]["ring"]["8"] == 0.9
    assert loaded["provenance"] == {"cpu_count": 2}
    assert baseline.describe(loaded)[1] == ("ring: T(4)/T(2) 1.50 ± 5% (model 1.50), "
                                            "T(8)/T(2) 1.80 ± 5% (model 1.75)")
    assert not list(path.parent.glob(".*tmp*"))


@pytest.mark.parametrize(("content", "needle"), [
    (None, "cannot read the baseline"),
    ("{not json", "cannot read the baseline"),
    ('{"schema_version": 1}', "schema_version 1"),
    ('{"schema_version": 2, "ratios": {}}', "no band, model_ratios"),
])
def test_load_baseline_errors_say_how_to_refresh(tmp_path, content, needle):
    path = tmp_path / "scaling.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match="--update-baseline") as err:
        load_baseline(path)
    assert needle in str(err.value)


def test_load_sweep_adds_each_runs_shortest_step_interval(tmp_path):
    from testbed.analysis.results import write_sweep_table

    sweep_dir = tmp_path / "s"
    run = sweep_dir / "runs" / "a-0"
    run.mkdir(parents=True)
    # First interval from the first start carries warm-up (0.9 s); then 0.5 and 0.6 s.
    pd.DataFrame({"t_start": [100.0, 100.1]}).to_parquet(run / "steps.parquet")
    pd.DataFrame({"t_applied": [102.0, 100.9, 101.4], "version": [3, 1, 2]}).to_parquet(run / "updates.parquet")
    rows = pd.DataFrame({"strategy": ["ring", "ring"], "workers": [2, 4], "repeat": [0, 0],
                         "status": ["completed", "failed"], "run_dir": ["runs/a-0", None]})
    write_sweep_table(rows, sweep_dir / "runs.parquet", {"name": "s", "grid": [], "repeats": 1})
    table = baseline.load_sweep(sweep_dir)
    assert table[baseline.METRIC].iloc[0] == pytest.approx(0.5)
    assert pd.isna(table[baseline.METRIC].iloc[1])
