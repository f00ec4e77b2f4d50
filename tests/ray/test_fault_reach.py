"""Faults a user cannot see otherwise: an injected fault the run never got to (an asynchronous
worker's share of --steps) is recorded and printed; a gossip worker's death names the worker,
says gossip cannot recover, and is recorded."""

import json

import pytest

from testbed.session.execute import execute
from tests.ray.helpers import make_config

FAST = {"workload.name": "synthetic", "workload.grad_mb": 0.01, "workload.compute_ms": 1.0,
        "cluster.timeout_s": 10.0}


def test_an_async_fault_past_the_slow_workers_share_is_recorded_and_printed(tmp_path, capsys):
    from testbed.run import _report

    steps = 12
    # worker 1 is far slower: worker 0 applies nearly every version, worker 1 never gets near `at`
    cfg = make_config(strategy="ps-async", workers=2, steps=steps, out=str(tmp_path), quiet=True,
                      straggler="fixed:worker=1,delay=300ms",
                      **{**FAST, "faults.fail": f"worker=1,at={steps - 1}"})
    outcome = execute(cfg)
    assert outcome.exit_code == 0, outcome.error_line
    summary = json.loads((outcome.folder / "summary.json").read_text())
    missed = [f for f in summary["faults"] if f["kind"] == "fault-not-reached"]
    assert len(missed) == 1 and missed[0]["actor"] == "worker1" and missed[0]["fault"] == f"worker=1,at={steps - 1}"
    assert _report(cfg, outcome) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"testbed.run: warning: {missed[0]['error']}"]
    assert "never fired" in err[0] and "worker 1 made iterations 0.." in err[0]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_dead_gossip_worker_is_named_recorded_and_said_unrecoverable(tmp_path, asynchronous):
    workers = 3
    # asynchronous: the workers share --steps, so a worker the machine slows may never reach a later
    # iteration; its first is always issued (and waited for), so the fault is at 0 there
    at = 0 if asynchronous else 2
    cfg = make_config(strategy="gossip", workers=workers, steps=6 * workers, out=str(tmp_path), quiet=True,
                      **{**FAST, "faults.fail": f"worker=1,at={at}", "gossip.asynchronous": asynchronous})
    outcome = execute(cfg)
    assert outcome.exit_code == 1
    line = outcome.error_line
    assert "worker 1 died" in line and "gossip has no recovery" in line and "--max-restarts" in line
    summary = json.loads((outcome.folder / "summary.json").read_text())
    lost = [f for f in summary["faults"] if f["kind"] == "worker-lost"]
    assert [(f["actor"], f["iteration"]) for f in lost] == [("worker1", at)]
    assert summary["status"] == "failed" and summary["error"] == line
