"""Several logical workers per process (testbed.runtime.hosting) on the session's Ray."""

import os
import time

import numpy as np
import ray

from testbed.config import RunConfig, with_overrides
from testbed.runtime import remote
from testbed.runtime.cluster import Cluster
from testbed.workloads.reference import reference_training
from tests.ray.helpers import make_config, run_strategy


class Probe:
    def __init__(self, tag: str, *, rank: int, cpus: float) -> None:
        self.tag, self.rank, self.cpus = tag, rank, cpus

    def who(self) -> tuple[int, int, str, float]:
        return self.rank, os.getpid(), self.tag, self.cpus

    def nap(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank


def test_members_are_routed_by_rank_share_processes_and_run_at_once():
    cfg = with_overrides(RunConfig(workers=5), **{"cluster.workers_per_process": 2}).cluster
    with Cluster(cfg, workers=5, torch_workers=False) as cluster:
        members = remote.spawn(Probe, cluster, 5, "t", concurrency=1)
        try:
            who = ray.get([m.who.remote() for m in members], timeout=60)
            assert [w[0] for w in who] == list(range(5)) and {w[2] for w in who} == {"t"}
            pids = [w[1] for w in who]
            assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]  # ranks 0-1, 2-3, 4
            assert len(set(pids)) == 3 == cluster.processes
            assert who[0][3] == who[4][3] / 2  # a process's share, split among its members
            t0 = time.monotonic()
            assert ray.get([members[0].nap.remote(0.5), members[1].nap.remote(0.5)], timeout=60) == [0, 1]
            assert time.monotonic() - t0 < 0.95  # both members of one process at once, not in turn
        finally:
            remote.kill_all(members)
        assert not members


def test_hosted_workers_train_as_single_process_sgd_and_keep_their_own_nics():
    """ps-sync with 4 workers in 2 processes over an emulated network: the same parameters as the
    single-process reference, and each worker's own NIC counts its own bytes."""
    cfg = make_config(strategy="ps-sync", workers=4, steps=3, **{
        "cluster.workers_per_process": 2, "network.bandwidth": "1Gbit", "network.latency": "50us"})
    out = run_strategy(cfg)
    np.testing.assert_allclose(out["flat"], reference_training(cfg), rtol=1e-4, atol=1e-5)
    nics = out["summary"]["nic_egress_bytes_per_step"]
    assert {f"worker{r}" for r in range(4)} <= set(nics)
    assert len({nics[f"worker{r}"] for r in range(4)}) == 1 and nics["worker0"] > 0
