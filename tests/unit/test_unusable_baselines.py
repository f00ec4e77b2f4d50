"""A baseline that cannot be compared fails the check: a file without one usable ratio is
refused before Ray (exit 2, one line whose fix names --baseline), a point whose ratio is NaN
fails its row (exit 1) instead of passing as `ok`."""

from __future__ import annotations

import json
import math

import pytest

from testbed.analysis import baseline, regression


def _spec_file(tmp_path):
    path = tmp_path / "regression.toml"
    path.write_text('name = "regression"\n[base]\nworkload = "synthetic"\nsteps = 2\n'
                    '"network.bandwidth" = "1Gbit"\n[grid]\nstrategy = ["ring"]\nworkers = [2, 4]\n')
    return path


def _baseline(tmp_path, spec_path, ratios):
    from testbed.sweep.spec import load_spec, spec_dict, spec_hash

    spec = load_spec(spec_path)
    data = {"schema_version": baseline.SCHEMA_VERSION, "metric": baseline.METRIC, "mode": "emulated",
            "spec": spec_dict(spec), "spec_identity": spec_hash(spec), "provenance": {},
            "tolerance": {}, "ratios": ratios, "band": {}, "model_ratios": {}}
    path = tmp_path / "odd name.json"
    path.write_text(json.dumps(data))  # json writes float("nan") as NaN, as a hand edit may
    return path


@pytest.mark.parametrize("ratios", [
    {"ring": {"2": math.nan, "4": math.nan}},
    {"ring": {"2": None, "4": "1.5"}},
    {},
    {"ring": {}},
    {"ring": [1.0, 1.5]},
])
def test_check_refuses_a_baseline_without_one_usable_ratio_before_ray(tmp_path, capsys, ratios):
    from testbed.sweep import main

    spec = _spec_file(tmp_path)
    path = _baseline(tmp_path, spec, ratios)
    out = tmp_path / "out"
    assert main([str(spec), "--out", str(out), "--check", "--baseline", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert str(path) in err and f"--update-baseline --baseline {path}" in err and str(spec) in err, err
    assert not out.exists()  # refused before the sweep folder, let alone Ray


def test_a_point_whose_baseline_ratio_is_nan_fails_its_row():
    measured = {"ring": {"2": 1.0, "4": 1.5, "8": 1.8}}
    data = {"ratios": {"ring": {"2": 1.0, "4": math.nan, "8": 1.8}}, "band": {}, "model_ratios": {}}
    rows = {r.n: r for r in regression.check(measured, data)}
    assert rows[4].verdict == "no baseline value" and rows[4].drift is None
    assert rows[2].verdict == rows[8].verdict == "ok"
    assert not regression.passed(list(rows.values()))
    fix = baseline.refresh("b.json", "s.toml")
    line = rows[4].message(fix)
    assert "T(4)/T(2) is nan" in line and line.endswith(fix) and "--baseline b.json" in fix


def test_the_report_of_a_nan_point_fails_and_says_how_to_refresh(tmp_path):
    measured = {"ring": {"2": 1.0, "4": 1.5}}
    data = {"ratios": {"ring": {"2": 1.0, "4": math.nan}}, "band": {}, "model_ratios": {}}
    rows = regression.check(measured, data)
    fix = baseline.refresh(tmp_path / "b.json", "s.toml")
    report = regression.write_report(tmp_path, rows, data, {"refresh": fix})
    assert not report["passed"] and report["failures"] == [rows[1].message(fix)]
    assert "no baseline value" in (tmp_path / "regression.md").read_text()


def test_a_baseline_with_some_usable_ratios_loads(tmp_path):
    path = _baseline(tmp_path, _spec_file(tmp_path), {"ring": {"2": 1.0, "4": math.nan}})
    assert baseline.load_baseline(path)["ratios"]["ring"]["2"] == 1.0
