"""A calibration file's numbers are checked before Ray (finite; alpha >= 0, bandwidth > 0), a
prediction that fails anyway is a field of the summary, and a calibration measured on another
machine class is named on stderr."""

from __future__ import annotations

import dataclasses
import json
import math

import pandas as pd
import pytest

from testbed.analysis.provenance import calibration_machine_change, this_machine
from testbed.config import RunConfig
from testbed.config.calibration import calibration_doc
from tests.unit.test_cli_errors import FAST_S, run_cli

GOOD = {"alpha_s": 1e-4, "bandwidth_Bps": 1e9}


def _file(tmp_path, entry, provenance=None, name="cal.json"):
    doc = calibration_doc({"call": entry}, "same node", provenance or this_machine(), "2026-01-01T00:00:00Z")
    path = tmp_path / name
    path.write_text(json.dumps(doc))  # json writes inf as Infinity and nan as NaN
    return path


@pytest.mark.parametrize(("field", "value"), [
    ("bandwidth_Bps", math.inf), ("bandwidth_Bps", math.nan), ("bandwidth_Bps", -math.inf),
    ("alpha_s", math.inf), ("alpha_s", math.nan), ("bandwidth_Bps", "1e9"), ("alpha_s", True),
])
def test_a_calibration_number_that_is_not_finite_is_refused_before_ray(tmp_path, field, value):
    path = _file(tmp_path, {**GOOD, field: value})
    code, out, err, took = run_cli(["--strategy", "mapreduce", "--workers", "2", "--steps", "2",
                                    "--calibration", str(path), "--out", str(tmp_path / "out")], tmp_path)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert str(path) in lines[0] and field in lines[0] and "python -m testbed.bench network" in lines[0]
    assert took < FAST_S and not (tmp_path / "out").exists() and not out


def _records(n=4):
    steps = pd.DataFrame({"t_start": [float(i) for i in range(n)], "compute_s": 0.01, "comm_s": 0.02,
                          "injected_delay_s": 0.0, "iteration": list(range(n)), "late_s": 0.0})
    updates = pd.DataFrame({"t_applied": [i + 0.5 for i in range(n)]})
    return steps, updates


def test_a_prediction_that_raises_is_a_field_of_the_summary(tmp_path):
    from testbed.analysis import predict as session
    from testbed.strategies.registry import SPECS

    spec = SPECS["mapreduce"]
    cfg = RunConfig(strategy="mapreduce", workers=2)
    cfg = dataclasses.replace(cfg, network=dataclasses.replace(cfg.network, bandwidth="1Gbit"))
    steps, updates = _records()

    class Broken(type(spec)):
        def predict(self, *args, **kwargs):
            raise ValueError("bandwidth inf B/s: must be finite")

    broken = object.__new__(Broken)
    broken.__dict__.update(spec.__dict__)
    summary = {"step_time_mean_s": 0.5}
    out = session.predictions(broken, cfg, summary, steps, updates, {"grad_bytes_logical": 1 << 20})
    assert "bandwidth inf B/s" in out["prediction_missing"] and "predicted_step_s" not in out
    assert out["comm_s_per_step"] is not None  # what came before the failure is kept


def test_a_calibration_file_changed_after_validation_costs_no_summary(tmp_path):
    from testbed.analysis import predict as session
    from testbed.strategies.registry import SPECS

    path = _file(tmp_path, GOOD)
    cfg = RunConfig(strategy="mapreduce", workers=2)
    cfg = dataclasses.replace(cfg, network=dataclasses.replace(cfg.network, calibration=str(path)))
    steps, updates = _records()
    extra = {"grad_bytes_logical": 1 << 20}
    ok = session.predictions(SPECS["mapreduce"], cfg, {"step_time_mean_s": 0.5}, steps, updates, extra)
    assert ok["predicted_step_s"] > 0 and "prediction_missing" not in ok
    _file(tmp_path, {**GOOD, "bandwidth_Bps": math.inf})  # the same path, rewritten mid-run
    out = session.predictions(SPECS["mapreduce"], cfg, {"step_time_mean_s": 0.5}, steps, updates, extra)
    assert "bandwidth_Bps" in out["prediction_missing"] and "predicted_step_s" not in out


def test_a_calibration_of_another_machine_class_is_named_in_one_warning(tmp_path):
    here = this_machine()
    assert calibration_machine_change(str(_file(tmp_path, GOOD, here))) is None
    other = {**here, "cpu_count": (here["cpu_count"] or 1) * 16}
    line = calibration_machine_change(str(_file(tmp_path, GOOD, other, "other.json")))
    assert line and "other.json" in line and f"cpu_count {other['cpu_count']!r} there" in line
    assert "python -m testbed.bench network" in line and "\n" not in line
    assert calibration_machine_change(str(_file(tmp_path, GOOD, {"python": "3"}, "bare.json"))) is None


def test_synthetic_compute_beside_its_configured_time_warns_where_the_processes_woke_late():
    """ps-async N = 256 at D = 8 measured a median compute 1.07x its 0.1 s (its first iterations
    all start together on 2 cores): the ratio says it, and from 3 updates a warning names it."""
    from testbed.analysis.predict import compute_fidelity

    on_time = compute_fidelity(0.1002, 0.1, 4)
    assert on_time["emulation_compute_ratio"] == pytest.approx(1.002) and on_time["compute_warning"] is None
    late = compute_fidelity(0.107 * 1.5, 0.1, 4)
    assert late["emulation_compute_ratio"] == pytest.approx(1.605) and "1.60x --compute-ms" in late["compute_warning"]
    assert compute_fidelity(0.2, 0.1, 2)["compute_warning"] is None  # too few updates to say
