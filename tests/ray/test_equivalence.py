"""Every synchronous strategy equals single-process training on the concatenated batch (DESIGN §4),
with the run's optimizer (sgd, momentum, adam) and the ResNet's batch-norm rule."""

import numpy as np
import pytest

from testbed.reference import reference_training
from tests.ray.helpers import make_config, run_strategy

# The torch-free synthetic gradient depends on the parameters (w - w* plus seeded noise per worker
# and iteration), so it checks averaging and replica consistency as a real model does, without
# each actor importing torch; the real models below cover the autograd path.
SYN = {"workload.name": "synthetic", "workload.grad_mb": 0.01, "workload.compute_ms": 0.0}
SMALL_BUCKETS = {**SYN, "ring.bucket_mb": 0.004}  # 8 tensors of 328 floats: 2 tensors a bucket
# ResNet-50's 161 tensors at 1/10000 of their size, bucketed by their real sizes (6 buckets: the
# first of 1 MiB at most, then 25 MiB)
PROFILE = {"workload.name": "profile:resnet50", "workload.payload": "scaled:0.0001",
           "workload.compute_ms": 0.0, "workload.grad_mb": 4.0}  # 4.0: the default, as the profile asks
# The real architectures, tiny: one torch case per strategy, so that every strategy meets the
# autograd path once: SGD where the driver applies the mean, Adam where every worker does (the
# ring, torch's allreduce), momentum where servers hold the state (whole, and split across two
# shards); the ResNet (with its batch-norm rule) meets three strategies, the transformer two.
# Each torch worker costs a process that imports torch (seconds of CPU on 2 cores), so the
# strategies' averaging, partitioning, bucketing and replica consistency, at N = 1..4, are
# covered on the torch-free synthetic workload below.
# The ResNet's batch norm uses each worker's own batch statistics and the reference normalises
# each worker's slice of the global batch alike (nets.GhostBatchNorm).
# Adam at lr 1e-3: it divides by sqrt(v), so where a gradient is near zero the ring's other order of
# summation moves an element by up to a whole step (lr); at 1e-2 one element in 4k left atol 1e-5.
RESNET = {"workload.name": "resnet", "workload.width": 4}
LM = {"workload.name": "transformer", "workload.d_model": 16, "workload.layers": 1, "workload.heads": 2,
      "workload.seq_len": 16, "workload.vocab": 16}
RESNET_SGD = {**RESNET, "workload.optimizer": "sgd", "workload.lr": 0.1}
RESNET_ADAM = {**RESNET, "workload.optimizer": "adam", "workload.lr": 0.001}
LM_ADAM = {**LM, "workload.optimizer": "adam", "workload.lr": 0.001}
CASES = [
    ("mapreduce", 2, RESNET_SGD),
    ("ring", 2, RESNET_ADAM),
    ("allreduce-torch", 2, LM_ADAM),
    ("ps-async", 1, {**LM, "workload.optimizer": "momentum", "workload.lr": 0.1}),  # sequential, state on the server
    ("ps-sync", 3, {**RESNET, "workload.optimizer": "momentum", "ps.shards": 2}),  # momentum split across servers
    ("ps-async", 1, SYN),  # one async worker is sequential SGD
    ("mapreduce", 4, {**SYN, "cluster.workers_per_process": 3}),  # ranks 0-2 share a process, 3 alone
    ("ps-sync", 4, SYN),
    ("ps-sync", 4, {**SYN, "ps.shards": 2, "ps.partition_mb": 0.002}),  # 5 partitions on 2 servers
    ("ps-sync", 3, {**SYN, "ps.servers": 3, "ps.placement": "colocated", "ps.partition_mb": 0.002}),
    *[("ring", n, SMALL_BUCKETS) for n in (1, 2, 4)],  # N = 2: one chunk each way
    ("ring", 4, {**SMALL_BUCKETS, "cluster.workers_per_process": 3}),  # in-process slots + 2 channels
    ("ring", 3, {**SMALL_BUCKETS, "ring.overlap": False}),
    # buckets overlapped, any-pair sends over gloo (the ring's exchange over torch: test_ring.py)
    ("ring", 3, {**SMALL_BUCKETS, "ring.transport": "torch", "ring.algorithm": "halving-doubling"}),
    ("allreduce-torch", 3, SMALL_BUCKETS),
    ("ring", 2, PROFILE),
]


def _id(strategy, n, extra):
    shown = {k: v for k, v in extra.items() if k not in SYN and k not in RESNET and k not in LM}
    kind = extra.get("workload.name", "mlp")
    return f"{strategy}-n{n}-{kind}" + "".join(f"-{k.split('.')[-1]}={v}" for k, v in shown.items()
                                              if k not in ("workload.name", "workload.payload",
                                                           "workload.grad_mb", "workload.lr"))


@pytest.mark.parametrize(("strategy", "workers", "extra"), CASES, ids=[_id(*c) for c in CASES])
def test_matches_single_process_sgd(strategy, workers, extra):
    cfg = make_config(strategy=strategy, workers=workers, **extra)
    out = run_strategy(cfg)
    ref = reference_training(cfg)
    assert out["flat"].shape == ref.shape
    np.testing.assert_allclose(out["flat"], ref, rtol=1e-4, atol=1e-5)
    assert len(out["updates"]) == cfg.steps
    assert (out["steps"]["staleness"] == 0).all()
    assert (out["steps"]["version_applied"] == out["steps"]["version_read"]).all()
    if out["replicas"] is not None:  # ring: replicas never diverge
        for rep in out["replicas"]:
            np.testing.assert_allclose(rep, out["replicas"][0], rtol=1e-6, atol=1e-7)
    if extra.get("ring.bucket_mb"):
        assert out["summary"]["buckets"] > 1
    if extra is PROFILE:  # the model's tensors, its logical size, buckets over its real sizes
        s = out["summary"]
        assert (s["tensors"], s["buckets"], s["grad_bytes_logical"]) == (161, 6, 4 * 25_557_032)


def test_reference_is_not_trivially_equal():
    """The comparison can fail: summing instead of averaging gives other parameters."""
    cfg = make_config(strategy="mapreduce", workers=3)
    doubled = make_config(strategy="mapreduce", workers=3, **{"workload.lr": 0.6})
    assert not np.allclose(reference_training(cfg), reference_training(doubled), rtol=1e-4, atol=1e-5)
