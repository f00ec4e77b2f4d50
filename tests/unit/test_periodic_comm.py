"""A strategy that communicates on some iterations only (local SGD: an average every H-th) is
measured by the mean step, as its prediction spreads the averages over the iterations; the
median step would be one without communication (testbed.analysis.predict.critical_comm_s)."""

import pandas as pd
import pytest

from testbed.analysis.predict import critical_comm_s
from testbed.config import RunConfig, with_overrides
from testbed.strategies.registry import SPECS


def _records(compute: float, average: float, h: int, steps: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two workers, every iteration `compute` long, every H-th (and the last) `average` longer:
    the records a local SGD run writes, by hand."""
    rows, applied, t = [], [], 0.0
    for i in range(steps):
        for w in range(2):
            rows.append({"iteration": i, "worker": w, "t_start": t, "compute_s": compute, "injected_delay_s": 0.0})
        t += compute + (average if (i + 1) % h == 0 or i + 1 == steps else 0.0)
        applied.append(t)
    return pd.DataFrame(rows), pd.DataFrame({"t_applied": applied})


def test_the_mean_step_counts_the_averages_the_median_step_misses():
    steps, updates = _records(compute=0.1, average=0.4, h=4, steps=8)
    assert critical_comm_s(steps, updates) == pytest.approx(0.0)  # the median step has no average
    assert critical_comm_s(steps, updates, periodic=True) == pytest.approx(2 * 0.4 / 8)  # R/S of one


def test_local_sgd_is_periodic_with_rounds_longer_than_one_step_and_the_others_are_not():
    spec = SPECS["local-sgd"]
    assert spec.periodic(with_overrides(RunConfig(strategy="local-sgd"), **{"localsgd.local_steps": 4}))
    assert not spec.periodic(with_overrides(RunConfig(strategy="local-sgd"), **{"localsgd.local_steps": 1}))
    assert not any(s.periodic(RunConfig(strategy=name)) for name, s in SPECS.items() if name != "local-sgd")
