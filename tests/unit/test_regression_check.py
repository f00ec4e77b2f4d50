"""The regression check on literal tables: bands from measured spread, verdicts, the report, and
the CLI's refusals before Ray starts (spec changed, real-network baseline on another machine)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from testbed.analysis import baseline, regression
from testbed.analysis.baseline import write_baseline

# Step times (s) per strategy, N and repeat.
STEP = {("ps-sync", 2): (1.0, 1.02, 0.98), ("ps-sync", 8): (3.0, 3.09, 2.94),
        ("ring", 2): (0.5, 0.5, 0.5), ("ring", 8): (0.9, 0.9, 0.9)}
MODEL = {"ps-sync": {2: 1.0, 8: 3.0}, "ring": {2: 0.5, 8: 0.875}}
PROV = {"git_commit": "a" * 40, "git_dirty": False, "cpu_model": "cpu X", "cpu_count": 2,
        "memory_gib": 24, "arch": "x86_64", "python": "3.11", "ray": "2", "torch": "2"}
SPEC = {"name": "regression", "repeats": 1, "base": {"steps": 3}, "grid": {"strategy": ["ring"]}}


def table(step=STEP, model=True) -> pd.DataFrame:
    rows = [{"strategy": s, "workers": n, "repeat": r, "status": "completed", baseline.METRIC: t,
             **({"predicted_step_s": MODEL[s][n]} if model else {})}
            for (s, n), times in step.items() for r, t in enumerate(times)]
    return pd.DataFrame(rows)


def made(tmp_path, t=None, prov=PROV):
    return write_baseline(tmp_path / "b.json", table() if t is None else t,
                          {"spec": SPEC, "spec_file": "x.toml", "provenance": prov})


def test_band_is_the_floor_or_four_spreads_of_the_repeats(tmp_path):
    data = made(tmp_path)
    ratios = [3.0 / 1.0, 3.09 / 1.02, 2.94 / 0.98]
    rel = pd.Series(ratios).std(ddof=1) / pd.Series(ratios).median()
    assert data["spread"]["ps-sync"]["8"] == pytest.approx(rel, abs=1e-4)
    assert data["band"]["ps-sync"]["8"] == pytest.approx(max(0.05, 4 * rel), abs=1e-4)
    assert data["band"]["ring"]["8"] == baseline.BAND_FLOOR  # no spread: the stated floor
    noisy = {**STEP, ("ring", 8): (0.9, 1.0, 0.8)}
    wide = made(tmp_path, table(noisy))["band"]["ring"]["8"]
    assert wide == pytest.approx(4 * 0.2 / 1.8, abs=1e-3)  # std 0.2 of ratios 1.8, 2.0, 1.6
    assert data["repeats"] == 3 and data["mode"] == "emulated"
    assert data["spec_identity"] == baseline.spec_identity({**SPEC, "repeats": 7})  # repeats aside


def test_a_baseline_needs_three_repeats_of_every_point(tmp_path):
    two = table()[table()["repeat"] < 2]
    with pytest.raises(ValueError, match=r"at least 3 completed repeats.*--repeats 5"):
        made(tmp_path, two)


def test_within_the_band_passes_and_beyond_it_fails_naming_the_curve(tmp_path):
    data = made(tmp_path)
    one = table()[table()["repeat"] == 0]  # the check runs a single repeat
    rows = regression.check(baseline.curve_ratios(one), data)
    assert regression.passed(rows), regression.text_table(rows)
    assert [(r.curve, r.n) for r in rows] == [("ps-sync", 2), ("ps-sync", 8), ("ring", 2), ("ring", 8)]
    slow = one.copy()
    slow.loc[(slow["strategy"] == "ring") & (slow["workers"] == 8), baseline.METRIC] = 0.9 * 1.06
    rows = regression.check(baseline.curve_ratios(slow), data)
    assert [r.verdict for r in rows] == ["ok", "ok", "ok", "drift"]
    assert rows[3].message() == "ring: T(8)/T(2) is 1.91, baseline 1.80 (+6.0%, band 5.0%)"


def test_a_drift_within_what_the_emulator_received_late_passes_and_is_named(tmp_path):
    """Beside a CPU hog the ring's T(8)/T(2) moved +6.1% with 9.5% of its emulated time late at
    N = 8: the run itself measured that it could not resolve the point. The same drift with the
    emulator on time (a slower code path, an injected latency) fails."""
    data = made(tmp_path)
    one = table()[table()["repeat"] == 0].copy()
    ring8 = (one["strategy"] == "ring") & (one["workers"] == 8)
    one.loc[ring8, baseline.METRIC] = 0.9 * 1.06
    one[baseline.LATE] = 0.0
    assert [r.verdict for r in regression.check(baseline.curve_ratios(one), data, baseline.curve_late(one))] \
        == ["ok", "ok", "ok", "drift"]
    one.loc[ring8, baseline.LATE] = 0.005  # +6% against 5% + 0.5% (+ 0% at N0) still fails
    rows = regression.check(baseline.curve_ratios(one), data, baseline.curve_late(one))
    assert rows[3].verdict == "drift" and rows[3].message().endswith("(+6.0%, band 5.0% + 0.5% late)")
    one.loc[ring8, baseline.LATE] = 0.095
    rows = regression.check(baseline.curve_ratios(one), data, baseline.curve_late(one))
    assert regression.passed(rows) and rows[3].unresolved and rows[3].late == pytest.approx(0.095)
    assert "could not resolve it" in rows[3].message()
    assert "could not resolve it" in regression.markdown(rows, data, {})
    assert "(unresolved)" in regression.text_table(rows)
    assert not any(r.unresolved for r in rows[:3])


def test_off_model_missing_and_new_points_fail():
    data = {"ratios": {"ring": {"2": 1.0, "8": 2.4}, "ps-sync": {"2": 1.0, "8": 3.0}},
            "band": {"ring": {"2": 0.05, "8": 0.05}}, "model_ratios": {"ring": {"2": 1.0, "8": 1.75}}}
    rows = regression.check({"ring": {"2": 1.0, "8": 2.4, "16": 3.0}}, data)
    verdicts = {(r.curve, r.n): r.verdict for r in rows}
    assert verdicts == {("ps-sync", 2): "not measured", ("ps-sync", 8): "not measured",
                        ("ring", 2): "ok", ("ring", 8): "off model", ("ring", 16): "not in baseline"}
    off = next(r for r in rows if r.verdict == "off model")
    assert off.message() == "ring: T(8)/T(2) is 2.40, cost model 1.75 (+37.1%, tolerance 15%)"
    assert not regression.passed([])  # nothing measured is not a pass


def test_report_files(tmp_path):
    data = made(tmp_path)
    one = table()[table()["repeat"] == 0].copy()
    one.loc[(one["strategy"] == "ring") & (one["workers"] == 8), baseline.METRIC] = 1.2
    rows = regression.check(baseline.curve_ratios(one), data)
    report = regression.write_report(tmp_path, rows, data, {"spec_name": "regression",
                                                            "baseline_path": "b.json", "provenance": PROV})
    assert not report["passed"] and report["failures"] == [
        "ring: T(8)/T(2) is 2.40, baseline 1.80 (+33.3%, band 5.0%)"]
    on_disk = json.loads((tmp_path / "regression.json").read_text())
    assert on_disk["rows"][3]["verdict"] == "drift" and on_disk["baseline"]["repeats"] == 3
    md = (tmp_path / "regression.md").read_text()
    assert md.startswith("### Scaling-curve regression: FAIL (regression)")
    assert "| ring | 8 | 1.800 | 2.400 | +33.3% | 5.0% | 0.0% | 1.750 | +37.1% | drift |" in md
    assert "commit `aaaaaaaaaaaa`" in md and (tmp_path / "regression.png").stat().st_size > 0
    text = regression.text_table(rows).splitlines()
    assert text[0].split() == ["curve", "N", "baseline", "measured", "drift", "band", "late", "model", "off",
                               "model", "verdict"]


def test_real_network_baselines_are_bound_to_their_machine_class(tmp_path):
    data = made(tmp_path, table(model=False))
    assert data["mode"] == "real" and data["model_ratios"] == {}
    assert baseline.machine_change(data, PROV) is None
    other = {**PROV, "cpu_count": 16}
    assert baseline.machine_change(data, other) == "cpu_count 2 there, 16 here"
    emulated = made(tmp_path)
    assert baseline.machine_change(emulated, other) is None  # emulated curves travel


def test_mixed_modelled_and_unmodelled_curves_are_refused(tmp_path):
    t = table()
    t.loc[t["strategy"] == "ring", "predicted_step_s"] = float("nan")
    with pytest.raises(ValueError, match="no cost-model prediction for ring"):
        made(tmp_path, t)


def test_a_baseline_that_departs_from_the_model_is_not_written(tmp_path):
    t = table()
    t.loc[(t["strategy"] == "ring") & (t["workers"] == 8), baseline.METRIC] = 1.5
    with pytest.raises(ValueError, match=r"ring: T\(8\)/T\(2\) is 3.00, cost model 1.75"):
        made(tmp_path, t)
    assert not (tmp_path / "b.json").exists()


def _spec_file(tmp_path, latency="50us"):
    path = tmp_path / "regression.toml"
    path.write_text(f'name = "regression"\n[base]\nworkload = "synthetic"\nsteps = 2\n'
                    f'"network.bandwidth" = "1Gbit"\n"network.latency" = "{latency}"\n'
                    '[grid]\nstrategy = ["ring"]\nworkers = [2, 4]\n')
    return path


def _baseline_of(tmp_path, spec_path, mode="emulated", prov=PROV):
    from testbed.sweep.spec import load_spec, spec_dict

    spec = spec_dict(load_spec(spec_path))
    ring = {("ring", 2): (0.5, 0.5, 0.5), ("ring", 4): (0.75, 0.75, 0.75)}
    t = table(ring, model=False)
    if mode == "emulated":
        t["predicted_step_s"] = t[baseline.METRIC]
    data = write_baseline(tmp_path / "b.json", t, {"spec": spec, "provenance": prov})
    return tmp_path / "b.json", data


@pytest.mark.parametrize(("case", "needle"), [
    ("no-baseline", "cannot read the baseline"),
    ("spec-changed", "was measured with another spec"),
    ("real-on-another-machine", "real-network curves of another machine class (cpu_count 64 there"),
    ("check-and-update", "--check and --update-baseline: pick one"),
    ("too-few-repeats", "--repeats 2: a baseline needs at least 3 repeats"),
])
def test_check_refuses_bad_input_before_ray(tmp_path, capsys, case, needle):
    from testbed.analysis.provenance import provenance
    from testbed.sweep import main

    spec = _spec_file(tmp_path)
    path, _ = _baseline_of(tmp_path, spec, mode="real" if case.startswith("real") else "emulated",
                           prov={**provenance(), "cpu_count": 64})
    args = {"no-baseline": ["--check", "--baseline", str(tmp_path / "none.json")],
            "spec-changed": ["--check", "--baseline", str(path)],
            "real-on-another-machine": ["--check", "--baseline", str(path)],
            "check-and-update": ["--check", "--update-baseline"],
            "too-few-repeats": ["--update-baseline", "--repeats", "2"]}[case]
    target = _spec_file(tmp_path, latency="1ms") if case == "spec-changed" else spec
    assert main([str(target), "--out", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "out").exists()  # refused before the sweep folder, let alone Ray


def test_allow_machine_change_accepts_a_real_baseline_of_another_machine(tmp_path):
    import argparse

    from testbed.analysis.provenance import provenance
    from testbed.sweep.check import baseline_for_check
    from testbed.sweep.spec import load_spec

    spec = _spec_file(tmp_path)
    path, data = _baseline_of(tmp_path, spec, mode="real", prov={**provenance(), "cpu_count": 64})
    args = argparse.Namespace(baseline=str(path), spec=str(spec), allow_machine_change=True)
    assert baseline_for_check(load_spec(spec), args)["mode"] == "real"


def test_off_the_model_within_what_the_emulator_received_late_passes_and_is_named():
    """Lateness moves a ratio off the model as it moves it off the baseline: a point beyond the
    model's tolerance but within it plus the late share passes as unresolved; beyond both fails."""
    data = {"ratios": {"ring": {"2": 1.0, "8": 2.0}}, "band": {"ring": {"2": 0.05, "8": 0.05}},
            "model_ratios": {"ring": {"2": 1.0, "8": 1.75}}}
    tol = regression.MODEL_TOLERANCE
    measured = {"ring": {"2": 1.0, "8": 1.75 * (1 + tol + 0.04)}}  # on the baseline, off the model
    data["ratios"]["ring"]["8"] = measured["ring"]["8"]
    late = {"ring": {"2": 0.0, "8": 0.01}}
    assert [r.verdict for r in regression.check(measured, data, late)] == ["ok", "off model"]
    late["ring"]["8"] = 0.05
    rows = regression.check(measured, data, late)
    assert regression.passed(rows) and rows[1].unresolved and not rows[0].unresolved
    assert "cost model 1.75" in rows[1].message() and "could not resolve it" in rows[1].message()
