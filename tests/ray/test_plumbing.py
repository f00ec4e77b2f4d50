"""Plumbing every strategy shares, one policy each: straggler stretch, NaN policy, timeline spans,
the cost model beside every run (or the reason it is missing)."""

import json

import numpy as np
import pandas as pd
import pytest

from testbed.emulation.faults import NonFiniteGradient
from testbed.session.execute import execute
from testbed.strategies.registry import SPECS
from tests.ray.helpers import make_config, run_strategy

SYNTHETIC = {"workload.name": "synthetic", "workload.grad_mb": 0.01}


@pytest.mark.parametrize("strategy", ["ring", "allreduce-torch", "ps-sync"])
def test_slowdown_stretches_the_slow_workers_compute_on_every_strategy(strategy):
    """slowdown:factor=f makes worker 1's compute take f times as long, whatever the strategy."""
    factor = 3.0
    cfg = make_config(strategy=strategy, workers=2, steps=4, straggler=f"slowdown:worker=1,factor={factor}",
                      **SYNTHETIC, **{"workload.compute_ms": 40.0})
    steps = run_strategy(cfg)["steps"]
    slow, fast = steps[steps["worker"] == 1], steps[steps["worker"] == 0]
    assert (fast["injected_delay_s"] == 0).all()
    np.testing.assert_allclose(slow["injected_delay_s"], (factor - 1) * slow["compute_s"], rtol=1e-9)
    assert (slow["compute_s"] >= 0.039).all()  # the real (slept) compute, not the stretch


@pytest.mark.parametrize("asynchronous", [False, True])
def test_gossip_never_applies_a_non_finite_gradient(asynchronous):
    # asynchronous: the updates are any worker's iterations, and how many of them worker 1 gets
    # to is timing; its first is issued with everybody's, so the NaN goes there
    at = 0 if asynchronous else 1
    cfg = make_config(strategy="gossip", workers=3, steps=9 if asynchronous else 4, **SYNTHETIC,
                      **{"faults.fail": f"nan:worker=1,at={at}", "gossip.asynchronous": asynchronous})
    out = run_strategy(cfg)
    assert [f["kind"] for f in out["summary"]["faults"]] == ["nan-skipped"]
    row = out["steps"][(out["steps"]["worker"] == 1) & (out["steps"]["iteration"] == at)]
    assert row["version_applied"].isna().all() and row["staleness"].isna().all()
    assert np.isfinite(out["flat"]).all() and all(np.isfinite(r).all() for r in out["replicas"])


def test_gossip_on_nan_stop_ends_the_run():
    cfg = make_config(strategy="gossip", workers=3, steps=4, **SYNTHETIC,
                      **{"faults.fail": "nan:worker=1,at=1", "faults.on_nan": "stop"})
    with pytest.raises(Exception) as info:
        run_strategy(cfg)
    assert "not finite" in str(info.value) or isinstance(info.value, NonFiniteGradient)


NET = {"workload.name": "synthetic", "workload.grad_mb": 8.0, "workload.payload": "scaled:0.01",
       "workload.compute_ms": 0.0, "network.bandwidth": "1Gbit", "network.latency": "50us"}


@pytest.mark.parametrize(("strategy", "compression"), [("mapreduce", "fp16"), ("ps-sync", "topk:0.01")])
def test_compressed_runs_get_a_prediction_that_fits(strategy, compression):
    out = run_strategy(make_config(strategy=strategy, workers=4, steps=4, compression=compression, **NET))
    s = out["summary"]
    assert "prediction_missing" not in s and "P" in s["formula"]
    # 20% of the model either way; above it also the share this run measured arriving after its
    # emulated delivery, and this machine's own cost of the same messages now (the same run on the
    # real network)
    real = {k: v for k, v in NET.items() if not k.startswith("network.")}
    own = run_strategy(make_config(strategy=strategy, workers=4, steps=4, compression=compression,
                                   **real))["summary"]["comm_s_per_step"]
    model = s["predicted_comm_s"]
    high = model * (1.2 + s["emulation_leak_frac"]) + own
    assert 0.8 * model <= s["comm_s_per_step"] <= high, (s["comm_s_per_step"], model, high, own, s["emulation_leak_frac"])
    assert s["bytes_sent_per_worker_per_step"] == pytest.approx(s["predicted_bytes_sent_per_worker_per_step"],
                                                                rel=0.01)


def test_a_real_model_is_predicted_with_its_measured_compute():
    cfg = make_config(strategy="ring", workers=2, steps=4, **{"network.bandwidth": "1Gbit", "workload.name": "mlp",
                                                             "workload.compute_ms": 10.0})
    out = run_strategy(cfg)
    s, steps = out["summary"], out["steps"]
    assert s["predicted_compute_source"] == "measured"
    assert s["predicted_step_s"] == pytest.approx(s["predicted_compute_s"] + s["predicted_comm_s"])
    slowest = (steps["compute_s"] + steps["injected_delay_s"]).groupby(steps["iteration"]).max().median()
    assert s["predicted_compute_s"] == pytest.approx(slowest)  # what the model measured, not --compute-ms


def test_a_real_network_says_why_there_is_no_time_prediction():
    s = run_strategy(make_config(strategy="ring", workers=2, steps=2, **SYNTHETIC))["summary"]
    assert "predicted_comm_s" not in s and "real network" in s["prediction_missing"]
    assert s["bytes_sent_per_worker_per_step"] == pytest.approx(s["predicted_bytes_sent_per_worker_per_step"])


def test_parameter_server_shards_record_their_spans():
    out = run_strategy(make_config(strategy="ps-sync", workers=2, steps=3, **SYNTHETIC, **{"ps.shards": 2}))
    shards = {e["actor"] for e in out["events"] if e["actor"].startswith("ps")}
    assert shards == {"ps0", "ps1"}
    phases = {e["phase"] for e in out["events"] if e["actor"] == "ps0"}
    assert {"recv", "apply"} <= phases


def test_a_failed_run_keeps_its_timeline(tmp_path):
    """Spans travel with each report, so a run that stops at step 2 still has those of steps 0-1."""
    cfg = make_config(strategy="mapreduce", workers=2, steps=6, out=str(tmp_path), quiet=True, **SYNTHETIC,
                      **{"faults.fail": "nan:worker=0,at=2", "faults.on_nan": "stop"})
    outcome = execute(cfg)
    assert outcome.exit_code == 4 and "not finite" in outcome.error_line
    events = pd.read_parquet(outcome.folder / "events.parquet")
    computes = events[(events["phase"] == "compute") & (events["actor"] == "worker1")]
    assert len(computes) >= 2
    summary = json.loads((outcome.folder / "summary.json").read_text())
    assert summary["status"] == "diverged" and "--on-nan stop" in summary["error"]


def test_every_summary_key_of_a_run_is_documented():
    from testbed.analysis.keys import documented

    for strategy in ("ring", "gossip"):
        s = run_strategy(make_config(strategy=strategy, workers=2, steps=2, **SYNTHETIC))["summary"]
        assert set(s) <= documented(SPECS), sorted(set(s) - documented(SPECS))
