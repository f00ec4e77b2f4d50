"""Scaling-curve regression check on literal tables: ratios, compare() passing and failing, file I/O."""

from __future__ import annotations

import copy
import json

import pandas as pd
import pytest

from testbed.analysis import baseline
from testbed.analysis.baseline import (
    compare,
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


def test_ratios_are_medians_over_repeats_relative_to_the_smallest_n():
    got = curve_ratios(table())
    assert set(got) == {"ps-sync", "ring"}
    assert got["ps-sync"] == pytest.approx({"2": 1.0, "4": 1.7 / 1.1, "8": 3.0 / 1.1})
    assert got["ring"] == pytest.approx({"2": 1.0, "4": 1.5, "8": 1.8})


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


def test_identical_curves_pass():
    measured, model = curve_ratios(table()), model_ratios(table())
    assert compare(measured, copy.deepcopy(measured), model, 0.15) == []


def test_perturbed_baseline_fails_naming_the_curve_and_n():
    measured, model = curve_ratios(table()), model_ratios(table())
    moved = copy.deepcopy(measured)
    moved["ps-sync"]["8"] *= 1.3  # the baseline says ps-sync grew faster than it does now
    problems = compare(measured, moved, model, 0.15)
    assert len(problems) == 1
    msg = problems[0]
    assert msg.startswith("ps-sync: step-time ratio T(8)/T(2) is 2.73, baseline 3.55")
    assert "(-23.1%, tolerance 15%)" in msg
    moved["ps-sync"]["8"] = measured["ps-sync"]["8"] * 1.1  # within tolerance again
    assert compare(measured, moved, model, 0.15) == []
    assert len(compare(measured, moved, {}, 0.05)) == 1  # no model: only the baseline check


def test_departure_from_the_cost_model_is_flagged():
    measured, model = curve_ratios(table()), model_ratios(table())
    flat = copy.deepcopy(measured)
    flat["ring"]["8"] = 2.4  # ring no longer flat: the model says 1.75
    problems = compare(flat, flat, model, 0.15)
    assert problems == ["ring: step-time ratio T(8)/T(2) is 2.40, cost model 1.75 "
                        "(+37.1%, tolerance 15%)"]


def test_missing_curves_and_points_are_flagged():
    measured, model = curve_ratios(table()), model_ratios(table())
    less = copy.deepcopy(measured)
    del less["ring"]
    del less["ps-sync"]["8"]
    problems = compare(less, measured, model, 0.15)
    assert any(p.startswith("ring: in the baseline but not measured") for p in problems)
    assert any(p.startswith("ps-sync: no measured step time at N=8") for p in problems)
    problems = compare(measured, less, model, 0.15)
    assert any(p.startswith("ring: measured but not in the baseline") for p in problems)
    assert any(p.startswith("ps-sync: N=8 is not in the baseline") for p in problems)
    shifted = {"ring": {"4": 1.0, "8": 1.2}}
    assert "not comparable" in compare(shifted, {"ring": measured["ring"]}, {}, 0.15)[0]


def test_write_and_load_round_trip(tmp_path):
    path = tmp_path / "b" / "scaling.json"
    meta = {"spec": {"name": "regression"}, "machine": {"cpu_count": 2}}
    data = write_baseline(path, table(), meta)
    loaded = load_baseline(path)
    assert loaded == json.loads(json.dumps(data))
    assert loaded["schema_version"] == baseline.SCHEMA_VERSION
    assert loaded["tolerance"] == baseline.DEFAULT_TOLERANCE == 0.15
    assert loaded["metric"] == baseline.METRIC and loaded["spec"] == {"name": "regression"}
    assert loaded["ratios"]["ring"] == {"2": 1.0, "4": 1.5, "8": 1.8}
    assert loaded["model_ratios"]["ring"] == {"2": 1.0, "4": 1.5, "8": 1.75}
    assert loaded["step_time_s"]["ring"]["8"] == 0.9
    assert compare(curve_ratios(table()), loaded["ratios"], loaded["model_ratios"],
                   loaded["tolerance"]) == []
    assert baseline.describe(loaded)[1] == "ring: T(4)/T(2) 1.50 (model 1.50), T(8)/T(2) 1.80 (model 1.75)"
    assert not list(path.parent.glob(".*tmp*"))


def test_a_baseline_that_departs_from_the_model_is_not_written(tmp_path):
    t = table()
    t.loc[(t["strategy"] == "ring") & (t["workers"] == 8), baseline.METRIC] = 1.5
    with pytest.raises(ValueError, match=r"ring: step-time ratio T\(8\)/T\(2\) is 3.00, cost model"):
        write_baseline(tmp_path / "x.json", t, {"spec": {}})
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize(("content", "needle"), [
    (None, "cannot read the baseline"),
    ("{not json", "cannot read the baseline"),
    ('{"schema_version": 99}', "schema_version 99"),
    ('{"schema_version": 1, "ratios": {}}', "no model_ratios"),
])
def test_load_baseline_errors_say_how_to_refresh(tmp_path, content, needle):
    path = tmp_path / "scaling.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match="--update-baseline") as err:
        load_baseline(path)
    assert needle in str(err.value)


def test_a_baseline_needs_the_cost_model_for_every_curve(tmp_path):
    with pytest.raises(ValueError, match="emulated network"):
        write_baseline(tmp_path / "x.json", table().drop(columns=["predicted_step_s"]), {})
    t = table()
    t.loc[t["strategy"] == "ring", "predicted_step_s"] = float("nan")
    with pytest.raises(ValueError, match="no cost-model prediction for ring"):
        write_baseline(tmp_path / "x.json", t, {})
    assert not (tmp_path / "x.json").exists()


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
