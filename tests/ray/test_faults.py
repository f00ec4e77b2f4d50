"""Faults: deaths, hangs, NaN gradients and interrupts never hang a run or lose its records."""

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from testbed.analysis.results import load_run
from testbed.config import from_dict
from testbed.workloads.reference import reference_training
from tests.ray.helpers import make_config, run_strategy

# the torch-free synthetic gradient: restarted actors come back without importing torch
FAST = {"cluster.timeout_s": 10.0, "workload.name": "synthetic", "workload.grad_mb": 0.01,
        "workload.compute_ms": 1.0}


def _kinds(out):
    return [f["kind"] for f in out["extra"].get("faults", [])]


@pytest.mark.parametrize("strategy", ["mapreduce", "ps-sync"])
def test_killed_worker_is_restarted_and_result_equals_no_fault_run(strategy):
    cfg = make_config(strategy=strategy, workers=3, steps=6, **FAST, **{"faults.fail": "worker=1,at=2"})
    out = run_strategy(cfg)
    assert _kinds(out) == ["worker-restart"]
    assert out["extra"]["faults"][0]["iteration"] == 2
    np.testing.assert_allclose(out["flat"], reference_training(cfg), rtol=1e-4, atol=1e-5)
    assert len(out["updates"]) == cfg.steps


def test_worker_lost_after_its_push_landed_is_not_counted_twice_nor_waited_for():
    # the death a lost machine causes: the shard applied worker 1's iteration-2 gradient, the
    # driver never heard. The redone iteration is a duplicate at the shard; its reply must not
    # wait for a version that needs this very worker's next gradient (that deadlocked)
    cfg = make_config(strategy="ps-sync", workers=3, steps=6, **FAST, **{"faults.fail": "sent:worker=1,at=2"})
    # (a redone push that waited for that version would wait for ever: nothing progresses, and the
    # driver stops the run after max(1, --max-restarts) --timeout windows without an update)
    out = run_strategy(cfg)
    assert _kinds(out) == ["worker-restart"]
    np.testing.assert_allclose(out["flat"], reference_training(cfg), rtol=1e-4, atol=1e-5)
    assert list(out["updates"]["version"]) == list(range(1, cfg.steps + 1))


def test_a_sent_fault_is_refused_where_workers_cannot_fire_it():
    with pytest.raises(Exception, match="cannot fire 'sent'"):
        make_config(strategy="ring", workers=3, **{"faults.fail": "sent:worker=1,at=2"})


def test_async_keeps_applying_while_a_worker_restarts():
    cfg = make_config(strategy="ps-async", workers=3, steps=150,
                      **{**FAST, "faults.fail": "worker=0,at=2", "workload.compute_ms": 50.0})
    out = run_strategy(cfg)
    assert _kinds(out) == ["worker-restart"]
    assert list(out["updates"]["version"]) == list(range(1, 151))
    fault = out["extra"]["faults"][0]
    assert fault["time_lost_s"] > 0
    # while worker 0 was down (its iteration 2 failed and was redone), the others' gradients
    # kept being applied: at least half of what one of them makes at its pace in this run (the
    # median interval between its iterations; a driver that waited for the restart would apply
    # none meanwhile, and the others' pace is the machine's, not the 50 ms of compute)
    mine = out["steps"][out["steps"]["worker"] == 0].set_index("iteration")
    down, up = mine.loc[1, "t_start"] + mine.loc[1, "compute_s"], mine.loc[2, "t_start"]
    others = out["steps"][out["steps"]["worker"] != 0].sort_values("iteration")
    pace = np.median(np.concatenate([np.diff(g["t_start"].to_numpy()) for _, g in others.groupby("worker")]))
    upd = out["updates"]["t_applied"]
    assert up - down > 0.5
    assert ((upd > down) & (upd < up)).sum() >= 0.5 * (up - down) / pace, pace


@pytest.mark.parametrize("strategy", ["mapreduce", "ps-sync", "ps-async"])
def test_nan_gradient_is_never_applied(strategy):
    # ps-async: workers run free, so the run must last until worker 1 reaches its iteration 1
    # whatever the machine's pace (20 updates at 10 ms of compute each, both workers alike)
    steps, pace = (20, {"workload.compute_ms": 10.0}) if strategy == "ps-async" else (4, {})
    cfg = make_config(strategy=strategy, workers=2, steps=steps, **{**FAST, **pace},
                      **{"faults.fail": "nan:worker=1,at=1"})
    out = run_strategy(cfg)
    assert "nan-skipped" in _kinds(out)
    assert np.isfinite(out["flat"]).all()
    row = out["steps"][(out["steps"]["worker"] == 1) & (out["steps"]["iteration"] == 1)]
    assert row["version_applied"].isna().all() and row["staleness"].isna().all()
    if strategy != "ps-async":
        assert out["updates"]["contributors"].tolist()[1] == 1


def test_shard_death_resumes_from_checkpoint(tmp_path):
    """Partitioned: 5 partitions on 2 servers, each checkpointed on its own, with its Adam state;
    every one resumes."""
    cfg = make_config(strategy="ps-sync", workers=2, steps=8, **FAST,
                      **{"faults.fail": "server=0,at=5", "faults.checkpoint_every": 2,
                         "ps.shards": 2, "ps.partition_mb": 0.002, "workload.optimizer": "adam",
                         "workload.lr": 0.05})
    out = run_strategy(cfg, workdir=str(tmp_path))
    (fault,) = [f for f in out["extra"]["faults"] if f["kind"] == "server-restart"]
    assert fault["resumed_from_version"] == 4 and fault["updates_redone"] >= 0
    assert list(out["updates"]["version"]) == list(range(1, 9))
    np.testing.assert_allclose(out["flat"], reference_training(cfg), rtol=1e-4, atol=1e-5)


def _main(args, capsys):
    """The CLI's main in this process (on the session's Ray): exit code, stdout, stderr."""
    from testbed.run import main

    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_shard_death_without_checkpoint_stops_cleanly_and_keeps_records(tmp_path, capsys):
    code, out, err = _main(["--strategy", "ps-sync", "--workers", "2", "--steps", "8", "--fail", "server=0,at=3",
                            "--timeout", "10", "--out", str(tmp_path), "--quiet"], capsys)
    assert code == 3, err
    assert "no checkpoint" in err and "Traceback" not in err
    folder = Path(out.strip().splitlines()[-1])
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "failed" and "no checkpoint" in summary["error"]  # the reason, kept
    assert len(pd.read_parquet(folder / "steps.parquet")) >= 2 * 3


def test_restarts_exhausted_exit_3(tmp_path, capsys):
    code, out, err = _main(["--strategy", "mapreduce", "--workers", "2", "--steps", "5", "--fail", "worker=0,at=2",
                            "--max-restarts", "0", "--timeout", "10", "--out", str(tmp_path), "--quiet"], capsys)
    assert code == 3, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("testbed.run: error:") and "--max-restarts" in last
    assert "Traceback" not in err
    folder = Path(out.strip().splitlines()[-1])
    assert json.loads((folder / "summary.json").read_text())["status"] == "failed"
    assert len(pd.read_parquet(folder / "updates.parquet")) == 2


@pytest.mark.parametrize("fail", ["worker=1,at=2", "nan:worker=0,at=1"])
def test_ring_rebuilds_after_a_death_and_skips_a_nan_step(fail):
    """Adam: the survivors roll their optimizer state back with their parameters, and the restarted
    peer gets a survivor's (a peer that started Adam afresh would take other steps)."""
    cfg = make_config(strategy="ring", workers=3, steps=4, **FAST,
                      **{"faults.fail": fail, "workload.optimizer": "adam", "workload.lr": 0.05})
    out = run_strategy(cfg)
    kinds = _kinds(out)
    if fail.startswith("nan"):
        assert kinds == ["nan-skipped"] and out["updates"]["contributors"].tolist()[1] == 0
        assert np.isfinite(out["flat"]).all()
        return
    assert kinds == ["worker-restart"]
    np.testing.assert_allclose(out["flat"], reference_training(cfg), rtol=1e-4, atol=1e-5)
    for rep in out["replicas"]:
        np.testing.assert_allclose(rep, out["flat"], rtol=1e-6, atol=1e-7)


def test_a_peer_death_under_the_torch_transport_is_one_plain_line(tmp_path, capsys):
    code, out, err = _main(["--strategy", "ring", "--transport", "torch", "--workers", "3", "--steps", "6",
                            "--workload", "synthetic", "--fail", "worker=1,at=2", "--timeout", "20",
                            "--out", str(tmp_path), "--quiet"], capsys)
    assert code == 1
    assert err.count("\n") == 1 and "\x1b[" not in err and "Traceback" not in err
    assert "--transport object-store" in err and "step 2" in err
    summary = json.loads((Path(out.strip()) / "summary.json").read_text())
    assert summary["status"] == "failed" and "--transport object-store" in summary["error"]


@pytest.mark.parametrize("strategy", ["ps-async", "ring"])
def test_a_diverging_model_ends_as_diverged(tmp_path, capsys, strategy):
    """--lr 1e6: ps-async used to spin forever on skipped gradients, ring to report success."""
    code, out, err = _main(["--strategy", strategy, "--workers", "2", "--steps", "40", "--lr", "1e6",
                            "--out", str(tmp_path), "--quiet"], capsys)
    assert code == 4, err
    summary = json.loads((Path(out.strip()) / "summary.json").read_text())
    assert summary["status"] == "diverged" and ("--max-skipped" in summary["error"] or "not finite" in summary["error"])
    assert summary["steps"] < 40


@pytest.mark.slow
def test_a_hang_is_detected_within_the_timeout_and_recovered_quietly(tmp_path, capsys):
    args = ["--strategy", "mapreduce", "--workers", "2", "--steps", "4", "--workload", "synthetic",
            "--grad-mb", "0.01", "--fail", "hang:worker=1,at=1", "--timeout", "4", "--out", str(tmp_path), "--quiet"]
    t0 = time.monotonic()
    code, out, err = _main(args, capsys)
    assert code == 0, err
    assert time.monotonic() - t0 < 120
    assert "Traceback" not in err and "Unhandled error" not in err and "(raylet)" not in out + err
    run = load_run(out.strip())
    (fault,) = run["summary"]["faults"]
    assert fault["kind"] == "worker-restart" and fault["cause"] == "RemoteTimeout"
    flat = np.concatenate([v.ravel() for v in run["params"].values()])
    cfg = from_dict(run["config"]["config"])
    np.testing.assert_allclose(flat, reference_training(cfg), rtol=1e-4, atol=1e-5)
