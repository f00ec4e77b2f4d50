"""The single-process reference (testbed.workloads.reference): what it skips and what it keeps."""

import time

import numpy as np

from testbed.config import RunConfig, with_overrides
from testbed.workloads import synthetic
from testbed.workloads.reference import reference_training


def _synthetic(compute_ms: float) -> RunConfig:
    return with_overrides(RunConfig(strategy="mapreduce", workers=3, steps=4, seed=3),
                          **{"workload.name": "synthetic", "workload.grad_mb": 0.01,
                             "workload.compute_ms": compute_ms})


def test_the_reference_skips_synthetic_compute_time_and_keeps_its_arithmetic(monkeypatch):
    """--compute-ms is a sleep in each worker, not arithmetic (4 steps x 3 workers x 2 s would be
    24 s here): the reference never waits for it, and ends with the same parameters."""
    waits = []
    monkeypatch.setattr(synthetic, "_sleep_until", lambda t: waits.append(t - time.perf_counter()))
    slow = reference_training(_synthetic(2000.0))
    assert waits and max(waits) <= 0.0, f"the reference would sleep {max(waits):.2f} s"
    np.testing.assert_array_equal(slow, reference_training(_synthetic(0.0)))
    assert not np.array_equal(slow, reference_training(_synthetic(0.0), steps=3))  # steps do count
