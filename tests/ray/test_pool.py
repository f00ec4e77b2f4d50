"""Worker processes reused between runs (testbed.runtime.pool), as the suite's own runs use them:
a later run is built in an earlier run's processes and trains as a fresh one would; a late call
of an earlier run is refused; a process still busy when its run ends, and every process of a run
that injects faults, is never reused."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import numpy as np
import pytest
import ray

from testbed.runtime import hosting, pool, remote
from testbed.runtime.cluster import Cluster
from testbed.workloads.reference import reference_training
from tests.ray.helpers import make_config, run_strategy


class Probe:
    def __init__(self, config, *, rank: int, cpus: float) -> None:
        self.rank = rank

    def pid(self) -> int:
        return os.getpid()

    def nap(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank


@pytest.fixture
def warm():
    """The session's pool (conftest installs one), emptied so that counts start at zero."""
    p = pool.installed()
    assert p is not None, "the suite runs with a process pool installed (tests/conftest.py)"
    p.clear()
    p.created = p.reused = 0
    return p


def spawn_probes(cfg, n):
    cluster = Cluster(cfg.cluster, workers=n, torch_workers=False).start()
    return cluster, remote.spawn(Probe, cluster, n, cfg, concurrency=2)


def test_a_later_run_is_built_in_the_earlier_runs_processes_and_trains_as_a_fresh_one(warm):
    first = make_config(strategy="ps-sync", workers=3, steps=3)
    second = make_config(strategy="mapreduce", workers=3, steps=3, seed=5)
    for cfg in (first, second):
        out = run_strategy(cfg)
        np.testing.assert_allclose(out["flat"], reference_training(cfg), rtol=1e-4, atol=1e-5)
    # the PS's three workers and its server; three of them served the mapreduce run
    assert warm.created == 4 and warm.reused == 3
    assert sum(map(len, warm.idle.values())) == 4


def test_a_late_call_of_an_earlier_run_is_refused(warm):
    cfg = make_config(workers=1)
    cluster, (old,) = spawn_probes(cfg, 1)
    pid = ray.get(old.pid.remote(), timeout=60)
    remote.kill_all([old])
    cluster.stop()
    cluster, (new,) = spawn_probes(cfg, 1)
    try:
        assert ray.get(new.pid.remote(), timeout=60) == pid  # the same process, a new worker
        with pytest.raises(ray.exceptions.RayTaskError) as err:
            ray.get(old.pid.remote(), timeout=60)
        assert isinstance(remote.root_cause(err.value), hosting.StaleCall) or "StaleCall" in str(err.value)
    finally:
        remote.kill_all([new])
        cluster.stop()


def test_a_process_still_busy_when_its_run_ends_is_killed_not_reused(warm):
    cfg = make_config(workers=2)
    cluster, members = spawn_probes(cfg, 2)
    busy = members[0].host
    ref = members[0].nap.remote(30)  # a call of the run still running at its end
    time.sleep(0.2)
    remote.kill_all(members)
    cluster.stop()
    assert sum(map(len, warm.idle.values())) == 1 and not warm.lent(busy)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(ref, timeout=30)


def test_runs_that_need_processes_of_their_own_say_why():
    cfg = make_config(workers=2)
    ok = SimpleNamespace(started_ray=False, nodes_at_start=1, device="cpu")
    assert pool.ProcessPool.admits(ok, cfg) is None
    for spec in ("worker=1,at=2", "hang:worker=1,at=2", "nan:worker=0,at=1;worker=1,at=2"):
        faulty = make_config(workers=2, **{"faults.fail": spec})
        assert "kill or stall a process (--fail)" in pool.ProcessPool.admits(ok, faulty), spec
    poisoned = make_config(workers=2, **{"faults.fail": "nan:worker=1,at=2"})  # no process dies or stalls
    assert pool.ProcessPool.admits(ok, poisoned) is None
    assert "own Ray" in pool.ProcessPool.admits(SimpleNamespace(**{**vars(ok), "started_ray": True}), cfg)
    assert "nodes" in pool.ProcessPool.admits(SimpleNamespace(**{**vars(ok), "nodes_at_start": 2}), cfg)
    assert "GPU" in pool.ProcessPool.admits(SimpleNamespace(**{**vars(ok), "device": "cuda"}), cfg)


def test_a_run_that_injects_faults_gets_fresh_processes(warm):
    cfg = make_config(strategy="ps-sync", workers=2, steps=4, **{"faults.fail": "worker=1,at=2"})
    out = run_strategy(cfg)
    assert any(f["kind"] == "worker-restart" for f in out["summary"]["faults"])
    assert warm.created == 0 and warm.reused == 0
