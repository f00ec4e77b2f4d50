"""Tests for testbed.analysis.metrics: summarize() and straggler attribution on small literal tables.

Every expected number below is worked out by hand in the comments next to it.
"""

import json

import pandas as pd
import pytest

from testbed.analysis.metrics import summarize
from testbed.analysis.records import STEP_COLUMNS, UPDATE_COLUMNS
from testbed.analysis.results import table_frame

SUMMARY_NONE_KEYS = (
    "samples_per_s", "updates_per_s", "step_time_p50_s", "step_time_p95_s", "step_time_mean_s",
    "compute_frac", "comm_frac", "wait_frac", "injected_delay_frac",
    "bytes_sent_per_worker_per_step", "bytes_recv_per_worker_per_step", "loss_first",
    "loss_last", "train_wall_s", "staleness_mean", "staleness_p95", "staleness_max",
)


def step(worker, iteration, *, t_start, version_read=None, version_applied=None, compute_s=0.2,
         comm_s=0.1, wait_s=0.0, bytes_sent=1000, bytes_recv=2000, samples=32, loss=1.0,
         staleness=0, injected_delay_s=0.0, applied=True):
    version_read = iteration if version_read is None else version_read
    version_applied = iteration + 1 if version_applied is None else version_applied
    if not applied:  # a dropped gradient: null version and staleness, as the records have it
        version_applied = staleness = None
    return dict(run_id="r", strategy="s", worker=worker, iteration=iteration,
                version_read=version_read, version_applied=version_applied, t_start=t_start,
                compute_s=compute_s, comm_s=comm_s, wait_s=wait_s, bytes_sent=bytes_sent,
                bytes_recv=bytes_recv, samples=samples, loss=loss, staleness=staleness,
                injected_delay_s=injected_delay_s)


def update(version, t_applied, *, contributors=2, dropped=0, loss=1.0):
    return dict(version=version, t_applied=t_applied, contributors=contributors,
                dropped=dropped, loss=loss)


def frames(steps, updates):
    return table_frame(steps, STEP_COLUMNS), table_frame(updates, UPDATE_COLUMNS)


def sync_run():
    """2 workers x 3 synchronous steps.

    Iteration i starts at 100 + i on both workers; worker 1 is a straggler (+0.1 s injected)
    and worker 0 waits for it (0.15 s vs 0.05 s). Updates land at 100.5, 101.5, 103.0.
    """
    steps = [step(w, i, t_start=100.0 + i, wait_s=0.15 if w == 0 else 0.05,
                  injected_delay_s=0.1 if w == 1 else 0.0)
             for i in range(3) for w in range(2)]
    updates = [update(1, 100.5, loss=2.0), update(2, 101.5, loss=1.5), update(3, 103.0, loss=1.0)]
    return frames(steps, updates)


def test_sync_summary_hand_computed():
    s = summarize(*sync_run(), strategy="ring", workers=2, status="completed")
    assert (s["strategy"], s["workers"], s["status"]) == ("ring", 2, "completed")
    assert s["steps"] == 3 and s["worker_iterations"] == 6
    # wall: first start 100.0 -> last update 103.0
    assert s["train_wall_s"] == pytest.approx(3.0)
    # 6 applied iterations x 32 samples = 192 over 3 s; 3 updates over 3 s
    assert s["samples_per_s"] == pytest.approx(64.0)
    assert s["updates_per_s"] == pytest.approx(1.0)
    # intervals from the first start: 0.5, 1.0, 1.5
    assert s["step_time_p50_s"] == pytest.approx(1.0)
    assert s["step_time_p95_s"] == pytest.approx(1.0 + 0.9 * 0.5)  # linear, rank 1.9
    assert s["step_time_mean_s"] == pytest.approx(1.0)
    # summed time: compute 1.2 + injected 0.3 + comm 0.6 + wait (0.45 + 0.15) = 2.7
    assert s["compute_frac"] == pytest.approx(1.5 / 2.7)
    assert s["comm_frac"] == pytest.approx(0.6 / 2.7)
    assert s["wait_frac"] == pytest.approx(0.6 / 2.7)
    assert s["injected_delay_frac"] == pytest.approx(0.3 / 2.7)
    assert s["compute_frac"] + s["comm_frac"] + s["wait_frac"] == pytest.approx(1.0)
    assert s["bytes_sent_per_worker_per_step"] == pytest.approx(1000.0)
    assert s["bytes_recv_per_worker_per_step"] == pytest.approx(2000.0)
    assert (s["loss_first"], s["loss_last"]) == (2.0, 1.0)
    assert (s["staleness_mean"], s["staleness_p95"], s["staleness_max"]) == (0.0, 0.0, 0)
    assert s["dropped_gradients"] == 0
    assert s["updates_per_worker"] == {0: 3, 1: 3}


def async_run():
    """2 workers, 4 applied gradients and 1 dropped one (version_applied and staleness null).

    Applied staleness 0, 1, 3, 0; the dropped iteration carries 64 samples and 5000 bytes
    sent, which must not count as applied samples but do count as bytes sent.
    """
    steps = [
        step(0, 0, t_start=10.0, version_read=0, version_applied=1, staleness=0, loss=4.0),
        step(1, 0, t_start=10.2, version_read=0, version_applied=2, staleness=1, loss=3.0),
        step(0, 1, t_start=10.5, version_read=1, version_applied=4, staleness=3, loss=2.0),
        step(1, 1, t_start=10.6, version_read=4, applied=False, samples=64, bytes_sent=5000),
        step(0, 2, t_start=11.0, version_read=4, version_applied=4, staleness=0, loss=1.0),
    ]
    updates = [update(1, 10.5, contributors=1, loss=4.0),
               update(2, 10.7, contributors=1, loss=3.0),
               update(3, 11.2, contributors=1, dropped=1, loss=2.0),
               update(4, 12.0, contributors=1, loss=1.0)]
    return frames(steps, updates)


def test_async_summary_staleness_dropped_and_samples():
    s = summarize(*async_run(), strategy="ps-async", workers=2, status="completed")
    assert s["train_wall_s"] == pytest.approx(2.0)  # 10.0 -> 12.0
    assert s["samples_per_s"] == pytest.approx(4 * 32 / 2.0)  # dropped 64 not counted
    assert s["updates_per_s"] == pytest.approx(2.0)
    # intervals 0.5, 0.2, 0.5, 0.8 -> sorted 0.2 0.5 0.5 0.8; p50 = 0.5, p95 rank 2.85
    assert s["step_time_p50_s"] == pytest.approx(0.5)
    assert s["step_time_p95_s"] == pytest.approx(0.5 + 0.85 * 0.3)
    assert s["step_time_mean_s"] == pytest.approx(0.5)
    # staleness over applied only: 0 1 3 0 -> mean 1, sorted 0 0 1 3, p95 rank 2.85
    assert s["staleness_mean"] == pytest.approx(1.0)
    assert s["staleness_p95"] == pytest.approx(1 + 0.85 * 2)
    assert s["staleness_max"] == 3 and isinstance(s["staleness_max"], int)
    assert s["dropped_gradients"] == 1
    assert s["bytes_sent_per_worker_per_step"] == pytest.approx((4 * 1000 + 5000) / 5)
    assert s["updates_per_worker"] == {0: 3, 1: 1}
    assert (s["loss_first"], s["loss_last"]) == (4.0, 1.0)


@pytest.mark.parametrize("run", [sync_run, async_run])
def test_summary_does_not_depend_on_row_order(run):
    steps, updates = run()
    want = summarize(steps, updates, strategy="x", workers=2, status="completed")
    got = summarize(steps.iloc[::-1].reset_index(drop=True),
                    updates.sample(frac=1.0, random_state=1).reset_index(drop=True),
                    strategy="x", workers=2, status="completed")
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == (pytest.approx(value) if isinstance(value, float) else value), key


@pytest.mark.parametrize("run", [sync_run, async_run])
def test_summary_is_plain_json(run):
    s = summarize(*run(), strategy="x", workers=2, status="completed")
    assert json.loads(json.dumps(s, allow_nan=False))["steps"] == s["steps"]


def test_empty_run():
    steps, updates = frames([], [])
    s = summarize(steps, updates, strategy="ring", workers=4, status="failed")
    assert (s["steps"], s["worker_iterations"], s["dropped_gradients"]) == (0, 0, 0)
    assert s["status"] == "failed" and s["workers"] == 4
    assert all(s[k] is None for k in SUMMARY_NONE_KEYS)
    json.dumps(s, allow_nan=False)


def test_iterations_but_no_update_yet():
    steps, _ = sync_run()
    _, updates = frames([], [])
    s = summarize(steps, updates, strategy="ring", workers=2, status="interrupted")
    assert s["steps"] == 0 and s["worker_iterations"] == 6
    assert all(s[k] is None for k in SUMMARY_NONE_KEYS)


def test_empty_summary_has_the_same_keys_as_a_full_one():
    full = summarize(*sync_run(), strategy="ring", workers=2, status="completed")
    empty = summarize(*frames([], []), strategy="ring", workers=2, status="failed")
    assert empty.keys() == full.keys()  # tidy sweep tables need the same columns


def test_single_update_step_time_is_from_first_start():
    steps, updates = frames([step(0, 0, t_start=5.0)], [update(1, 5.25, contributors=1)])
    s = summarize(steps, updates, strategy="mapreduce", workers=1, status="completed")
    assert s["step_time_p50_s"] == s["step_time_p95_s"] == s["step_time_mean_s"] == pytest.approx(0.25)
    assert s["samples_per_s"] == pytest.approx(32 / 0.25)


def test_straggler_attribution_names_the_late_worker():
    from testbed.analysis.metrics import straggler_attribution

    steps = pd.DataFrame({
        "worker": [0, 1, 0, 1], "iteration": [0, 0, 1, 1],
        "t_start": [10.0, 10.0, 11.0, 11.0], "compute_s": [0.1, 0.1, 0.1, 0.1],
        "injected_delay_s": [0.5, 0.0, 0.3, 0.0], "wait_s": [0.0, 0.5, 0.0, 0.3],
    })
    att = straggler_attribution(steps)
    assert att[0]["ready_lag_s"] == pytest.approx(0.4) and att[1]["ready_lag_s"] == pytest.approx(0.0)
    assert att[1]["wait_s"] == pytest.approx(0.4) and att[0]["wait_s"] == pytest.approx(0.0)
