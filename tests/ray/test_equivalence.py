"""Every synchronous strategy equals single-process SGD on the concatenated batch (DESIGN §4)."""

import numpy as np
import pytest

from testbed.reference import reference_sgd
from tests.ray.helpers import make_config, run_strategy

pytestmark = pytest.mark.usefixtures("ray_cluster")

CASES = [
    *[("mapreduce", n, {}) for n in (1, 2, 3, 4)],
    *[("ps-sync", n, {}) for n in (1, 2, 3, 4)],
    ("ps-sync", 4, {"ps.shards": 2}),
    ("ps-sync", 3, {"ps.shards": 3}),
    *[("ring", n, {}) for n in (1, 2, 3, 4)],
    ("ring", 3, {"ring.overlap": False}),
    ("ring", 3, {"ring.transport": "torch"}),
    ("ring", 4, {"ring.transport": "torch", "ring.overlap": False}),
    *[("allreduce-torch", n, {}) for n in (2, 3)],
    ("ps-async", 1, {}),  # one async worker is sequential SGD
]


@pytest.mark.parametrize(("strategy", "workers", "extra"), CASES,
                         ids=[f"{s}-n{n}-{'-'.join(f'{k}={v}' for k, v in e.items()) or 'default'}"
                              for s, n, e in CASES])
def test_matches_single_process_sgd(strategy, workers, extra):
    cfg = make_config(strategy=strategy, workers=workers, **extra)
    out = run_strategy(cfg)
    ref = reference_sgd(cfg)
    assert out["flat"].shape == ref.shape
    np.testing.assert_allclose(out["flat"], ref, rtol=1e-4, atol=1e-5)
    assert len(out["updates"]) == cfg.steps
    assert (out["steps"]["staleness"] == 0).all()
    assert (out["steps"]["version_applied"] == out["steps"]["version_read"]).all()
    if out["replicas"] is not None:  # ring: replicas never diverge
        for rep in out["replicas"]:
            np.testing.assert_allclose(rep, out["replicas"][0], rtol=1e-6, atol=1e-7)


def test_reference_is_not_trivially_equal():
    """The comparison can fail: summing instead of averaging gives other parameters."""
    cfg = make_config(strategy="mapreduce", workers=3)
    doubled = make_config(strategy="mapreduce", workers=3, **{"workload.lr": 0.6})
    assert not np.allclose(reference_sgd(cfg), reference_sgd(doubled), rtol=1e-4, atol=1e-5)


def test_synthetic_workload_ring_equals_reference():
    cfg = make_config(strategy="ring", workers=3,
                      **{"workload.name": "synthetic", "workload.grad_mb": 0.01,
                         "workload.compute_ms": 1.0, "ring.bucket_mb": 0.004})
    out = run_strategy(cfg)
    np.testing.assert_allclose(out["flat"], reference_sgd(cfg), rtol=1e-5, atol=1e-6)
    assert out["extra"]["buckets"] > 1
