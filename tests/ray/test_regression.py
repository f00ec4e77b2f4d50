"""Scaling curves of experiments/regression.toml against the committed results/baselines/scaling.json.

Reruns the regression sweep through the CLI (emulated network, about a minute on 2 cores), with
--update-baseline aimed at a temporary file, and compares each strategy's step-time ratios
T(N)/T(2) with the committed baseline and with the cost model (testbed.analysis.baseline); a failure
says which curve moved, at which N, and by how much. Ratios are measured within one run, so
the check holds on any machine; absolute seconds are compared only with the model, within what
the machine measurably adds (`machine_cost`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.analysis.baseline import (
    REFRESH,
    compare,
    curve_ratios,
    load_baseline,
    load_sweep,
    model_ratios,
)
from testbed.sweep import load_spec, main, spec_dict
from tests.ray.helpers import make_config, run_strategy

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "experiments" / "regression.toml"
BASELINE = ROOT / "results" / "baselines" / "scaling.json"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("regression")
    target = out / "baselines" / "scaling.json"
    committed = BASELINE.stat().st_mtime_ns
    code = main([str(SPEC), "--out", str(out), "--quiet", "--update-baseline", "--baseline", str(target)])
    assert BASELINE.stat().st_mtime_ns == committed  # the committed file is written only by hand
    table = load_sweep(out / "regression")
    failed = table.loc[table["status"] != "completed", ["strategy", "workers", "error"]]
    assert failed.empty, f"regression runs failed:\n{failed.to_string()}"
    return table, code, target


def test_baseline_was_measured_with_this_spec():
    data = load_baseline(BASELINE)
    assert data["spec"] == spec_dict(load_spec(SPEC)), (
        f"{SPEC.name} changed since {BASELINE.name} was measured; refresh it: {REFRESH}")


def test_curves_match_the_baseline_and_the_cost_model(sweep):
    table, _, _ = sweep
    data = load_baseline(BASELINE)
    problems = compare(curve_ratios(table), data["ratios"], model_ratios(table), data["tolerance"])
    assert not problems, "scaling curves moved:\n" + "\n".join(problems)


@pytest.fixture(scope="module")
def machine_cost(sweep):
    """Per strategy, the communication per step of its largest-N point on the real network (no
    emulated time at all): this machine's own cost of the step's messages, calls and driver
    round trip, measured now, under whatever load the machine has now. An emulated step can add
    at most that to the model (part of it hides inside emulated transfers), divided by the
    run's dilation."""
    spec = load_spec(SPEC)
    base = {k: v for k, v in spec.base.items() if not k.startswith("network.")}
    n = max(spec.grid["workers"])
    return {strategy: run_strategy(make_config(**{**base, "strategy": strategy, "workers": n}))
            ["summary"]["comm_s_per_step"] for strategy in spec.grid["strategy"]}


def test_every_point_meets_the_cost_model(sweep, machine_cost):
    """Measured communication per step within 10% of the model, plus what the machine measurably
    adds: its own cost of the same step on the real network (divided by the dilation) and what
    the run measured leaking past the emulator (messages that arrived after their emulated
    delivery). Below the model only the 10%: nothing this machine does makes a step faster."""
    table = sweep[0]
    problems = []
    for _, row in table.iterrows():
        model, measured = row["predicted_comm_s"], row["comm_s_per_step"]
        own = max(0.0, machine_cost[row["strategy"]]) / row["dilation"]
        high = model * (1.10 + row["emulation_leak_frac"]) + own
        if not model * 0.90 <= measured <= high:
            problems.append(f"{row['strategy']} N={row['workers']}: measured {measured:.3f} s, model "
                            f"{model:.3f} s (allowed {0.9 * model:.3f}..{high:.3f} s: 10%, leak "
                            f"{row['emulation_leak_frac']:.1%}, this machine's own cost {own:.3f} s)")
    assert not problems, "\n".join(problems)


def test_curve_shapes(sweep):
    ratios = curve_ratios(sweep[0])
    # N gradients cross one NIC (the driver's, the single PS shard's): ~linear in N (model 3.0).
    for strategy in ("ps-sync", "mapreduce"):
        assert ratios[strategy]["8"] > 2, f"{strategy} T(8)/T(2) = {ratios[strategy]['8']:.2f}"
    # Each ring worker moves 2K(N-1)/N whatever N is: ~flat (model 1.75).
    assert ratios["ring"]["8"] < 2, f"ring T(8)/T(2) = {ratios['ring']['8']:.2f}"


def test_update_baseline_writes_this_measurement(sweep):
    table, code, target = sweep
    assert code == 0  # 1 would mean the curves left the cost model (see the test above)
    data = load_baseline(target)
    assert data["ratios"] == {s: pytest.approx(c, abs=1e-4) for s, c in curve_ratios(table).items()}
    assert data["spec"] == spec_dict(load_spec(SPEC))
    assert data["tolerance"] == 0.15 and data["machine"]["cpu_count"]
