"""Evaluations on literal numbers (placing them on the run's clock, time to target) and the
evaluator itself (its own process, at the lowest priority, on the recorder)."""

import os
import time

import numpy as np
import pandas as pd
import pytest

from testbed.analysis.evals import eval_points, eval_summary
from testbed.analysis.records import Recorder
from testbed.config import RunConfig, with_overrides
from testbed.session.evaluation import NICE, Evaluator

STEPS = pd.DataFrame({"t_start": [100.0, 100.5, 101.0]})
UPDATES = pd.DataFrame({"version": [1, 2, 3, 4], "t_applied": [101.0, 102.0, 103.0, 104.0],
                        "contributors": [2, 2, 1, 2]})


def evals(rows):
    return pd.DataFrame(rows, columns=["version", "eval_loss", "eval_acc", "eval_ms", "t_done"])


def test_points_are_placed_at_their_versions_on_the_run_clock():
    raw = evals([(2, 0.8, 0.6, 5.0, 110.0), (0, 1.4, 0.25, 5.0, 105.0), (4, 0.5, 0.8, 5.0, 111.0)])
    pts = eval_points(raw, UPDATES, STEPS, batch_size=10)
    assert list(pts["version"]) == [0, 2, 4]
    assert list(pts["train_s"]) == [0.0, 2.0, 4.0]  # from the first iteration's start (100.0)
    assert list(pts["samples_seen"]) == [0, 40, 70]  # 10 x contributors so far


def test_a_version_evaluated_twice_keeps_its_last_evaluation():
    raw = evals([(2, 0.9, 0.5, 1.0, 110.0), (2, 0.7, 0.6, 1.0, 112.0)])
    assert list(eval_points(raw, UPDATES, STEPS, 1)["eval_loss"]) == [0.7]


def test_time_to_target_is_the_first_version_that_meets_every_target():
    raw = evals([(0, 1.4, 0.25, 1, 1), (1, 0.9, 0.5, 1, 1), (2, 0.6, 0.55, 1, 1), (3, 0.55, 0.8, 1, 1),
                 (4, 0.7, 0.9, 1, 1)])
    pts = eval_points(raw, UPDATES, STEPS, batch_size=10)
    loss_only = eval_summary(pts, 0.65, None, None)
    assert (loss_only["updates_to_target"], loss_only["time_to_target_s"], loss_only["samples_to_target"]) == (2, 2.0, 40)
    both = eval_summary(pts, 0.65, 0.7, 1.1)
    assert (both["updates_to_target"], both["samples_to_target"], both["eval_loss_optimum"]) == (3, 50, 1.1)
    never = eval_summary(pts, 0.1, None, None)
    assert never["time_to_target_s"] is None and never["updates_to_target"] is None
    assert never["eval_loss_last"] == 0.7 and never["eval_acc_last"] == 0.9 and never["eval_loss_best"] == 0.55


def test_no_evaluation_gives_nulls():
    s = eval_summary(eval_points(evals([]), UPDATES, STEPS, 1), 0.5, None, None)
    assert s["evaluations"] == 0 and s["eval_loss_last"] is None and s["time_to_target_s"] is None


def test_the_recorder_asks_for_versions_zero_every_k_and_the_last():
    rec = Recorder()
    assert not rec.wants_eval(0)  # no evaluator: nothing is asked for
    got = []
    rec.plan_evaluation(3, 10, lambda v, p: got.append(v))
    for v in range(11):
        rec.evaluate(v, None)
    assert got == [0, 3, 6, 9, 10]


@pytest.mark.parametrize("workload", ["mlp", "synthetic"])
def test_the_evaluator_scores_what_it_is_handed(workload):
    """mlp: in a process of its own at nice 19; synthetic: on its thread. Fetches are called there."""
    from testbed.workloads import make_workload

    cfg = with_overrides(RunConfig(steps=4), **{"workload.name": workload, "eval.every": 2, "eval.samples": 64,
                                                "workload.grad_mb": 0.01})
    rec = Recorder()
    ev = Evaluator(cfg, rec)
    ev.attach()
    model = make_workload(cfg.workload, seed=cfg.seed, workers=cfg.workers)
    p0 = model.get_params()
    p1 = p0 + np.float32(0.1)
    rec.evaluate(0, p0)
    rec.evaluate(2, lambda: p1)
    if workload == "mlp":  # its process runs at the lowest priority
        deadline = time.time() + 60
        while ev._proc is None and time.time() < deadline:
            time.sleep(0.05)
        assert os.getpriority(os.PRIO_PROCESS, ev._proc.pid) == NICE
    ev.finish(120)
    assert ev.error is None
    assert [e["version"] for e in rec.evals] == [0, 2]
    assert rec.evals[0]["eval_loss"] == pytest.approx(model.evaluate(p0, 64)["loss"], rel=1e-6)
    assert rec.evals[1]["eval_loss"] == pytest.approx(model.evaluate(p1, 64)["loss"], rel=1e-6)
    assert ev._proc is None  # stopped


def test_an_evaluation_that_fails_is_said_not_swallowed():
    cfg = with_overrides(RunConfig(steps=2), **{"workload.name": "synthetic", "workload.grad_mb": 0.01})
    rec = Recorder()
    ev = Evaluator(cfg, rec)
    ev.attach()
    rec.evaluate(0, lambda: (_ for _ in ()).throw(RuntimeError("the servers are gone")))
    ev.finish(10)
    assert "evaluating version 0: RuntimeError: the servers are gone" == ev.error
