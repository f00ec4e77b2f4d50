"""--algorithm and --compression of `ring` on actors: every algorithm equals the numpy sum and
single-process SGD; fp16 stays within tolerance; top-k bytes follow k; predictions match."""

import numpy as np
import pytest
import ray

from testbed.allreduce.algorithms import ALGORITHMS, bytes_moved, groups_of_size, schedule
from testbed.allreduce.peer import RingPeer
from testbed.allreduce.spec import allreduce_comm_s
from testbed.training.compressor import topk_count
from testbed.workloads.reference import reference_training
from tests.ray.helpers import make_config, run_strategy

SYNTHETIC = {"workload.name": "synthetic", "workload.grad_mb": 0.01, "workload.compute_ms": 0.0}


@ray.remote
class _Probe(RingPeer):
    """A ring peer whose algorithm can be switched, to test many algorithms on one set of actors."""

    def use(self, algorithm: str, groups: list[list[int]], params: np.ndarray) -> None:
        self.algorithm = algorithm
        self.set_groups(groups)
        self.set_params(params)

    def allreduce(self, buf: np.ndarray, tag: str) -> tuple[np.ndarray, int, int]:
        buf = buf.copy()
        sent, recv = self._allreduce(buf, tag, 0)
        self.transport.settle()
        return buf, sent, recv

    def train(self, steps: int) -> np.ndarray:
        """Steps 0..steps-1 from the current parameters (every message of a run is consumed
        within it, so the next algorithm can reuse the same step numbers as tags)."""
        for i in range(steps):
            self.train_step(i)
        return self.get_params()


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_algorithm_on_actors_equals_numpy_sum_and_single_process_sgd(n):
    # synthetic gradients: no torch import per actor; the mlp runs through the strategy below
    cfg = make_config(strategy="ring", workers=n, steps=3, **SYNTHETIC)
    peers = [_Probe.options(num_cpus=0.1, max_concurrency=4).remote(cfg, rank=r) for r in range(n)]
    try:
        ray.get([p.connect_ring.remote(peers) for p in peers], timeout=60)
        init = ray.get(peers[0].get_params.remote(), timeout=60)
        ref = reference_training(cfg)
        rng = np.random.default_rng(n)
        # the any-pair algorithms; the ring's neighbour exchange: test_ring.py, test_equivalence.py
        for algorithm in [name for name, alg in ALGORITHMS.items() if not alg.neighbour_exchange]:
            groups = groups_of_size(n, 2)
            ray.get([p.use.remote(algorithm, groups, init) for p in peers], timeout=60)
            for length in (0, 2 * n + 1, 1001):
                bufs = [rng.standard_normal(length).astype(np.float32) for _ in range(n)]
                outs = ray.get([p.allreduce.remote(b, f"{algorithm}{length}")
                                for p, b in zip(peers, bufs, strict=True)], timeout=60)
                for r, (res, sent, recv) in enumerate(outs):
                    np.testing.assert_allclose(res, np.sum(bufs, axis=0), rtol=1e-5, atol=1e-5)
                    assert (sent, recv) == bytes_moved(schedule(algorithm, r, n, length, groups), 4)
            params = ray.get([p.train.remote(cfg.steps) for p in peers], timeout=60)
            for flat in params:  # every replica equals SGD on the concatenated batch
                np.testing.assert_allclose(flat, ref, rtol=1e-4, atol=1e-5, err_msg=algorithm)
    finally:
        for p in peers:
            ray.kill(p)


def test_hierarchical_strategy_with_emulated_nodes_and_prediction():
    cfg = make_config(strategy="ring", workers=4,
                      **{**SYNTHETIC, "ring.algorithm": "hierarchical", "ring.node_size": 2,
                         "network.bandwidth": "10Gbit", "network.latency": "50us"})
    out = run_strategy(cfg)
    np.testing.assert_allclose(out["flat"], reference_training(cfg), rtol=1e-4, atol=1e-5)
    extra, k = out["extra"], out["extra"]["grad_bytes_logical"]
    assert extra["algorithm"] == "hierarchical" and extra["nodes"] == 2
    assert extra["predicted_comm_s"] == pytest.approx(
        allreduce_comm_s("hierarchical", 4, k, 50e-6, 1.25e9, node_size=2, nodes=2))
    assert extra["formula"].startswith("2*ceil(log2(g))")
    # leaders (ranks 0, 2) also cross nodes; the total is the 2(N-1)K every algorithm moves
    per_step = out["steps"].groupby("iteration")["bytes_sent"].sum()
    assert (per_step == 2 * 3 * k).all()


def test_fp16_is_within_tolerance_of_uncompressed_and_halves_bytes():
    kw = {**SYNTHETIC, "ring.algorithm": "tree"}
    cfg = make_config(strategy="ring", workers=3, compression="fp16", **kw)
    out = run_strategy(cfg)
    ref = reference_training(make_config(strategy="ring", workers=3, **kw))
    np.testing.assert_allclose(out["flat"], ref, rtol=2e-3, atol=2e-3)
    assert not np.array_equal(out["flat"], ref)
    for rep in out["replicas"]:  # rounded the same way everywhere: replicas stay identical
        np.testing.assert_array_equal(rep, out["replicas"][0])
    k = out["extra"]["grad_bytes_logical"]
    assert out["steps"].groupby("iteration")["bytes_sent"].sum().tolist() == [2 * 2 * k // 2] * cfg.steps


def test_topk_bytes_match_k_and_training_still_converges():
    cfg = make_config(strategy="ring", workers=3, steps=5, compression="topk:0.01",
                      **{**SYNTHETIC, "workload.grad_mb": 0.05})
    out = run_strategy(cfg)
    numel = out["flat"].size
    k = topk_count(numel, 0.01)
    # each worker forwards N-1 packed payloads of k (int32 index, float32 value) pairs
    assert (out["steps"]["bytes_sent"] == (cfg.workers - 1) * 8 * k).all()
    assert (out["steps"]["bytes_recv"] == (cfg.workers - 1) * 8 * k).all()
    for rep in out["replicas"]:
        np.testing.assert_array_equal(rep, out["replicas"][0])
    losses = out["updates"]["loss"].to_numpy()
    assert losses[-1] < losses[0]
