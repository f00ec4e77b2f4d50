"""The --dilation auto search (testbed.session.autodilate) with trials made up by the test: where
the budget cuts the factor it would raise to, it goes on with half the real workers first."""

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from testbed.config import RunConfig, validate, with_overrides
from testbed.session.autodilate import _search, fewer_real_workers
from testbed.strategies.registry import SPECS


def config(**changes):
    base = with_overrides(RunConfig(strategy="ring", workers=64, steps=4), **{
        "workload.name": "synthetic", "network.bandwidth": "10Gbit", "network.fidelity_budget_s": 300.0})
    return validate(with_overrides(base, **changes), SPECS)


def trials_where(faithful_at_most: int):
    """Trials faithful with at most that many real workers; each step lasts 70 s, so at any factor
    above 1 a trial outgrows the 300 s budget, and at 1 it fits."""
    seen = []

    def execute(cfg):
        seen.append((cfg.network.dilation, cfg.real_workers))
        fid = 1.0 if cfg.real_workers <= faithful_at_most else 2.0
        return SimpleNamespace(exit_code=0, folder=None, error_line=None, summary={
            "status": "completed", "emulation_fidelity": fid, "emulation_leak_frac": 0.0, "step_time_mean_s": 70.0})
    return execute, seen


def test_an_unaffordable_factor_halves_the_real_workers_at_the_same_factor_until_faithful(tmp_path: Path):
    execute, seen = trials_where(faithful_at_most=4)
    cfg, factor, trials, result, _ = _search(config(), tmp_path, time.monotonic(), execute)
    assert seen == [(1.0, 16), (1.0, 8), (1.0, 4)]
    assert (cfg.real_workers, factor) == (4, 1.0) and result.startswith("faithful")
    assert [t["real_workers"] for t in trials] == [16, 8, 4]


def test_it_gives_up_with_one_real_worker_or_where_there_are_no_emulated_peers(tmp_path: Path):
    execute, seen = trials_where(faithful_at_most=0)
    cfg, _, _, result, _ = _search(config(), tmp_path, time.monotonic(), execute)
    assert [k for _, k in seen] == [16, 8, 4, 2, 1] and cfg.real_workers == 1
    assert "buys no larger factor" in result
    execute, seen = trials_where(faithful_at_most=0)
    _search(config(strategy="ps-async", **{"ps.staleness_bound": 1}), tmp_path, time.monotonic(), execute)
    assert seen == [(1.0, 64)]
    assert fewer_real_workers(config(**{"cluster.real_workers": 64, "ring.algorithm": "halving-doubling"})) is None


def test_each_trial_waits_its_timeout_times_its_factor(tmp_path: Path):
    """A trial at D waits --timeout x D: every wait of the dilated run is D times longer."""
    seen = []

    def execute(cfg):
        seen.append((cfg.network.dilation, cfg.cluster.timeout_s))
        fid = 1.0 if cfg.network.dilation > 4 else 3.0
        return SimpleNamespace(exit_code=0, folder=None, error_line=None, summary={
            "status": "completed", "emulation_fidelity": fid, "emulation_leak_frac": 0.0, "step_time_mean_s": 0.1})
    cfg = config(**{"cluster.timeout_s": 50.0, "cluster.real_workers": 64})
    _, factor, _, result, _ = _search(cfg, tmp_path, time.monotonic(), execute)
    assert result.startswith("faithful") and factor > 4 and len(seen) >= 2
    assert all(t == 50.0 * d for d, t in seen)


def test_a_raise_the_budget_cuts_short_halves_the_real_workers_first(tmp_path: Path):
    """A trial at D = 1 (fidelity 1.75, steps of 15 s) asks for D = 6; the 300 s budget affords 5
    for the whole run. The next trial is D = 1 with 8 real workers instead, faithful; the search
    used to raise D to what the budget afforded."""
    seen = []

    def execute(cfg):
        seen.append((cfg.network.dilation, cfg.real_workers))
        fid = 1.0 if cfg.real_workers <= 8 else 1.75
        return SimpleNamespace(exit_code=0, folder=None, error_line=None, summary={
            "status": "completed", "emulation_fidelity": fid, "emulation_leak_frac": 0.0, "step_time_mean_s": 15.0})
    cfg, factor, _, result, _ = _search(config(strategy="ps-sync"), tmp_path, time.monotonic(), execute)
    assert seen == [(1.0, 16), (1.0, 8)] and (cfg.real_workers, factor) == (8, 1.0) and result.startswith("faithful")


def test_the_model_seconds_are_the_first_trial_and_the_run_by_the_specs_own_prediction():
    """mapreduce's step is its compute plus 2a + (N+1) K / B at the driver (the pipelined model):
    4 updates, no longer than a trial, are the whole run, so the search's first trial lasts 4
    steps; 100 updates are a trial of TRIAL_STEPS and the run's 100. At 1.2 GB, N = 128 and 10
    Gbit/s that is 520 s, more than half the 300 s budget, so the search starts faster than real
    time; 100 MiB at N = 8 does not. No emulated network: no prediction."""
    from testbed.config.environment import MIN_DILATION
    from testbed.emulation.dilation import TRIAL_STEPS, first_factor
    from testbed.session.autodilate import model_seconds

    big = config(strategy="mapreduce", workers=128, **{"workload.grad_mb": 1200.0, "workload.compute_ms": 100.0})
    step = 0.1 + 129 * 1200 * 2**20 / 1.25e9  # latency 0
    assert model_seconds(big) == pytest.approx(4 * step, rel=1e-9)
    assert model_seconds(with_overrides(big, steps=100)) == pytest.approx((TRIAL_STEPS + 100) * step)
    assert first_factor(model_seconds(big), 300.0, MIN_DILATION) == 0.28
    small = config(strategy="mapreduce", workers=8, **{"workload.grad_mb": 100.0})
    assert first_factor(model_seconds(small), 300.0, MIN_DILATION) == 1.0
    assert model_seconds(with_overrides(small, **{"network.bandwidth": None})) is None
