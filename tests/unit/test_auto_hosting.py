"""--workers-per-process left out: the one automatic choice `validate` makes
(testbed.config.validate.auto_workers_per_process)."""

import pytest

from testbed.config import RunConfig, validate, with_overrides
from testbed.strategies.registry import SPECS


def _auto(monkeypatch, workers, **changes):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    base = {"workload.name": "synthetic", "workload.compute_ms": 0.0, **changes}
    return validate(with_overrides(RunConfig(strategy=changes.pop("strategy", "ps-sync"), workers=workers),
                                   **{k: v for k, v in base.items() if k != "strategy"}),
                    SPECS).cluster.workers_per_process


@pytest.mark.parametrize(("workers", "k"), [(1, 1), (16, 1), (17, 3), (64, 8), (128, 16), (4096, 512)])
def test_auto_hosting_keeps_at_most_8_processes_beyond_16_workers(monkeypatch, workers, k):
    assert _auto(monkeypatch, workers) == k
    assert _auto(monkeypatch, workers, strategy="mapreduce") == k
    assert _auto(monkeypatch, workers, strategy="ring") == k


@pytest.mark.parametrize("changes", [
    {"workload.name": "mlp"},                               # real compute: one interpreter each
    {"cluster.address": "10.0.0.1:6379"},                   # a real cluster: a process per worker
    {"strategy": "gossip"},                                 # a strategy that cannot share
    {"strategy": "ring", "ring.transport": "torch"},        # ... nor the ring over torch.distributed
    {"faults.fail": "kill:worker=1,at=2"},                  # a fault would take its neighbours down
    {"ps.servers": 4, "ps.placement": "colocated"},         # a colocated server has its worker's slot
])
def test_auto_hosting_is_one_process_per_worker_wherever_sharing_is_refused_or_unfaithful(monkeypatch, changes):
    assert _auto(monkeypatch, 64, **changes) == 1


def test_auto_hosting_is_one_process_per_worker_when_ray_address_names_a_cluster(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    cfg = with_overrides(RunConfig(strategy="ps-sync", workers=64), **{"workload.name": "synthetic"})
    assert validate(cfg, SPECS).cluster.workers_per_process == 1


def test_a_given_workers_per_process_is_kept(monkeypatch):
    assert _auto(monkeypatch, 64, **{"cluster.workers_per_process": 1}) == 1
    assert _auto(monkeypatch, 64, **{"cluster.workers_per_process": 32}) == 32
