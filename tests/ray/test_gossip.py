"""Gossip SGD on actors: complete graph = synchronous SGD, ring = single-process D-PSGD with a
shrinking consensus distance, d*K bytes per step, asynchronous invariants, emulated cost."""

import numpy as np
import pytest
import ray

from testbed.analysis.records import Recorder
from testbed.emulation.peers import owner
from testbed.gossip.topology import consensus_distance, mix, mixing_row, neighbours
from testbed.runtime.cluster import Cluster
from testbed.strategies.registry import SPECS
from testbed.workloads import make_workload
from testbed.workloads.reference import reference_training
from tests.ray.helpers import make_config, run_strategy

SYNTHETIC = {"workload.name": "synthetic", "workload.grad_mb": 0.01, "workload.compute_ms": 0.0}


def test_complete_graph_equals_synchronous_sgd_and_sends_d_times_k():
    cfg = make_config(strategy="gossip", workers=3, **{"gossip.topology": "complete"})
    out = run_strategy(cfg)
    np.testing.assert_allclose(out["flat"], reference_training(cfg), rtol=1e-4, atol=1e-5)
    for rep in out["replicas"]:  # one mixing round on the complete graph is the exact average
        np.testing.assert_allclose(rep, out["replicas"][0], rtol=1e-6, atol=1e-7)
    steps, k = out["steps"], out["extra"]["grad_bytes_logical"]
    assert out["extra"]["degree"] == 2
    assert (steps["bytes_sent"] == 2 * k).all() and (steps["bytes_recv"] == 2 * k).all()
    assert (steps["staleness"] == 0).all() and (steps["version_read"] == steps["iteration"]).all()
    assert list(out["updates"]["version"]) == list(range(1, cfg.steps + 1))
    assert (out["updates"]["contributors"] == 3).all()
    assert out["extra"]["consensus_distance"] == pytest.approx([0.0] * cfg.steps, abs=1e-6)


def _dpsgd_reference(cfg, start):
    """Single-process synchronous gossip: x_i <- sum_j W_ij (x_j - lr g_j(x_j)), per step; an
    emulated peer's gradient is its owner's, g_o(x_o) (testbed.emulation.peers)."""
    n, lr = cfg.workers, np.float32(cfg.workload.lr)
    nbrs = neighbours(cfg.gossip.topology, n)
    model = make_workload(cfg.workload, seed=cfg.seed, workers=n)
    xs, distances = [x.copy() for x in start], []
    for t in range(cfg.steps):
        stepped = []
        for i, x in enumerate(xs):
            o = owner(n, cfg.real_workers, i)
            model.set_params(xs[o])
            stepped.append(x - lr * model.gradient(model.batch(o, t))[0])
        xs = [mix(mixing_row(i, nbrs), dict(enumerate(stepped))) for i in range(n)]
        distances.append(consensus_distance(xs))
    return xs, distances


def test_ring_gossip_matches_dpsgd_and_consensus_distance_shrinks():
    cfg = make_config(strategy="gossip", workers=6, **SYNTHETIC, **{"gossip.topology": "ring"})
    rec = Recorder()
    cluster = Cluster(cfg.cluster, workers=cfg.workers, torch_workers=False)
    with cluster, SPECS["gossip"].create(cfg, cluster) as strategy:
        base = strategy.replica_parameters()[0]
        rng = np.random.default_rng(0)
        start = [base + rng.standard_normal(base.size).astype(np.float32) for _ in range(cfg.workers)]
        ray.get([p.set_params.remote(x) for p, x in zip(strategy.peers, start, strict=True)], timeout=60)
        strategy.run(rec)
        replicas, extra = strategy.replica_parameters(), strategy.summary_extra()
        flat = np.concatenate([v.ravel() for v in strategy.parameters().values()])
    expected, distances = _dpsgd_reference(cfg, start)
    for got, want in zip(replicas, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(flat, np.mean(expected, axis=0), rtol=1e-5, atol=1e-5)
    d = [extra["consensus_distance_initial"], *extra["consensus_distance"]]
    assert all(b < a for a, b in zip(d, d[1:], strict=False)), d
    assert d[-1] < 0.3 * d[0]
    np.testing.assert_allclose(extra["consensus_distance"], distances, rtol=1e-4)
    assert len(rec.updates) == cfg.steps and extra["degree"] == 2


def test_emulated_peers_step_their_own_replicas_with_their_owners_gradients_at_their_own_times():
    """N = 6 on a ring graph played by 2 real workers (positions 0 and 3): every replica equals
    D-PSGD where a peer's gradient is its owner's, and a straggler that is an emulated peer
    (position 1, 300 ms) holds its owner's rounds back: its models leave when it is done."""
    cfg = make_config(strategy="gossip", workers=6, steps=3,
                      **{**SYNTHETIC, "gossip.topology": "ring", "network.bandwidth": "10Gbit",
                         "cluster.real_workers": 2, "straggler": "fixed:worker=1,delay=300ms"})
    out = run_strategy(cfg)
    start = [make_workload(cfg.workload, seed=cfg.seed, workers=6).get_params()] * 6
    expected, distances = _dpsgd_reference(cfg, start)
    for got, want in zip(out["replicas"], expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["extra"]["consensus_distance"], distances, rtol=1e-4, atol=1e-7)
    assert distances[-1] > 0  # two owners' gradients: the replicas do differ
    steps = out["steps"]
    assert sorted(set(steps["worker"])) == [0, 3] and (steps["staleness"] == 0).all()
    assert (steps[steps["worker"] == 0]["comm_s"] >= 0.3).all()  # waits for its peer's models


def test_async_gossip_invariants_and_emulated_cost():
    cfg = make_config(strategy="gossip", workers=4, steps=5,
                      **{**SYNTHETIC, "workload.grad_mb": 0.25, "workload.payload": "scaled:0.1",
                         "gossip.asynchronous": True, "gossip.topology": "torus",
                         "network.bandwidth": "1Gbit", "network.latency": "100us"})
    out = run_strategy(cfg)
    steps, updates, k = out["steps"], out["updates"], out["extra"]["grad_bytes_logical"]
    assert len(steps) == cfg.steps == len(updates)  # one applied gradient per update
    assert list(updates["version"]) == list(range(1, cfg.steps + 1))
    assert (steps["staleness"] >= 0).all() and (steps["version_applied"] >= steps["version_read"]).all()
    # an exchange moves the model both ways, booked on the worker that starts it
    assert (steps["bytes_sent"] == k).all() and (steps["bytes_recv"] == k).all()
    assert np.isfinite(updates["loss"]).all()
    assert out["extra"]["formula"].startswith("2*(a + K/B)")
    assert out["extra"]["predicted_comm_s"] == pytest.approx(2 * (100e-6 + k / 125e6))
    # emulation sleeps until delivery: an exchange cannot beat the uncontended round trip
    assert steps["comm_s"].median() >= 0.9 * out["extra"]["predicted_comm_s"]


def test_one_async_worker_is_sequential_sgd():
    cfg = make_config(strategy="gossip", workers=1, **SYNTHETIC, **{"gossip.asynchronous": True})
    out = run_strategy(cfg)
    np.testing.assert_allclose(out["flat"], reference_training(cfg), rtol=1e-5, atol=1e-6)
    assert (out["steps"]["bytes_sent"] == 0).all()


def test_the_dead_worker_is_named_whether_its_own_step_or_a_neighbours_failed_first():
    """A neighbour's step that called the dead worker fails with that death as its cause: the run
    must name the dead worker, not the neighbour whose error arrived first."""
    import ray

    from testbed.gossip.strategy import _Driver

    class Peer:
        def __init__(self, actor: str) -> None:
            self._actor_id = type("ActorID", (), {"hex": lambda _self: actor})()

    driver = _Driver([Peer("a0"), Peer("a1"), Peer("a2")], "sync_step", 1, 3, 1.0)
    own = ray.exceptions.RayActorError(actor_id="a1")
    via_neighbour = ray.exceptions.RayTaskError("sync_step", "", own).as_instanceof_cause()
    assert isinstance(via_neighbour, ray.exceptions.RayActorError)
    assert driver._dead(own, 1) == 1
    assert driver._dead(via_neighbour, 0) == 1  # worker 0's step failed calling worker 1
    assert driver._dead(ray.exceptions.RayActorError(actor_id="elsewhere"), 2) == 2
