"""A strategy that communicates on some iterations only (local SGD: an average every H-th) is
measured by the mean step, as its prediction spreads the averages over the iterations; the
median step would be one without communication (testbed.analysis.predict.critical_comm_s)."""

from pathlib import Path

import pandas as pd
import pytest

from testbed.analysis.predict import critical_comm_s
from testbed.config import RunConfig, with_overrides
from testbed.map.spotchecks import STEPS, check_config
from testbed.map.table import whole_rounds
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


def _local(h: int, steps: int = 100) -> RunConfig:
    return with_overrides(RunConfig(strategy="local-sgd"), steps=steps, **{"localsgd.local_steps": h})


def test_local_sgd_communicates_once_a_round_and_the_others_every_iteration():
    assert SPECS["local-sgd"].period(_local(4)) == 4 and SPECS["local-sgd"].period(_local(1)) == 1
    assert all(s.period(RunConfig(strategy=name)) == 1 for name, s in SPECS.items() if name != "local-sgd")


@pytest.mark.parametrize("h", [1, 4, 16])
def test_the_map_and_its_checks_predict_whole_rounds_so_their_plans_agree(h):
    """The map predicts a configuration over whole rounds (its steady state, one average in H)
    and a check runs whole rounds: the same R/S, so a check's own prediction is the map's."""
    spec = SPECS["local-sgd"]
    mapped = whole_rounds(spec, _local(h))
    assert mapped.steps % h == 0 and mapped.steps >= 100
    checked = check_config(mapped, 1.0, 2**30, Path("/tmp"))
    assert checked.steps % h == 0 and checked.steps >= STEPS
    pred = {s: spec.predict(c, {"grad_bytes_logical": 2**27, "buckets": 1}, 5e-5, 1.25e9).comm_s
            for s, c in (("map", mapped), ("check", checked))}
    assert pred["map"] == pytest.approx(pred["check"])
