"""Every synchronous strategy equals single-process training on the concatenated batch (DESIGN §4),
with the run's optimizer (sgd, momentum, adam) and the ResNet's batch-norm rule."""

import numpy as np
import pytest

from testbed.strategies.registry import SPECS
from testbed.workloads import tiny
from testbed.workloads.reference import reference_training
from tests.ray.helpers import make_config, run_strategy

# Each strategy declares the runs that must equal one-process training (`StrategySpec.equivalence`,
# on the presets of testbed.workloads.tiny): the torch-free synthetic gradient covers averaging,
# partitioning, bucketing and replica consistency at N = 1..4, the tiny real architectures the
# autograd path (SGD where the driver applies the mean, Adam where every worker does, momentum
# where servers hold the state). The ResNet's batch norm uses each worker's own batch statistics
# and the reference normalises each worker's slice of the global batch alike (nets.GhostBatchNorm).
CASES = [(name, case.workers, dict(case.overrides)) for name, spec in SPECS.items() for case in spec.equivalence]


def _id(strategy, n, extra):
    shown = {k: v for k, v in extra.items() if k not in tiny.SYN and k not in tiny.RESNET and k not in tiny.LM}
    kind = extra.get("workload.name", "mlp")
    return f"{strategy}-n{n}-{kind}" + "".join(f"-{k.split('.')[-1]}={v}" for k, v in shown.items()
                                              if k not in ("workload.name", "workload.payload",
                                                           "workload.grad_mb", "workload.lr"))


@pytest.mark.parametrize(("strategy", "workers", "extra"), CASES, ids=[_id(*c) for c in CASES])
def test_matches_single_process_sgd(strategy, workers, extra):
    cfg = make_config(strategy=strategy, workers=workers, **extra)
    out = run_strategy(cfg)
    own = SPECS[strategy].reference(cfg)
    ref = reference_training(cfg) if own is None else own
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
    if extra.get("workload.name") == tiny.PROFILE["workload.name"]:  # the model's tensors, its logical size, buckets over its real sizes
        s = out["summary"]
        assert (s["tensors"], s["buckets"], s["grad_bytes_logical"]) == (161, 6, 4 * 25_557_032)


def test_reference_is_not_trivially_equal():
    """The comparison can fail: summing instead of averaging gives other parameters."""
    cfg = make_config(strategy="mapreduce", workers=3)
    doubled = make_config(strategy="mapreduce", workers=3, **{"workload.lr": 0.6})
    assert not np.allclose(reference_training(cfg), reference_training(doubled), rtol=1e-4, atol=1e-5)
