"""Scaling curves of experiments/regression.toml against the committed results/baselines/scaling.json.

Runs `python -m testbed.sweep experiments/regression.toml --check` in-process (the command users
put in their CI; emulated network, about 40 s on 2 cores): every strategy's step-time ratios
T(N)/T(2) against the committed baseline (bands from the spread it measured) and the cost model
(testbed.analysis.baseline, testbed.analysis.regression). A failure names the curve, the N
and the drift. Ratios are measured within one run, so the check holds on any machine; absolute
seconds are compared only with the model, within what the machine measurably adds
(`machine_cost`). And the check must be able to fail: a slowdown injected into one strategy
makes it fail naming that curve, and only that one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from testbed.analysis.baseline import (
    METRIC,
    MIN_REPEATS,
    curve_ratios,
    load_baseline,
    load_sweep,
    shortest_interval,
    spec_identity,
)
from testbed.sweep import load_spec, main, spec_dict
from testbed.sweep.check import check_sweep
from tests.ray.helpers import make_config, run_strategy

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "experiments" / "regression.toml"
BASELINE = ROOT / "results" / "baselines" / "scaling.json"


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    out = tmp_path_factory.mktemp("regression")
    committed = BASELINE.stat().st_mtime_ns
    code = main([str(SPEC), "--check", "--out", str(out), "--quiet", "--baseline", str(BASELINE)])
    assert BASELINE.stat().st_mtime_ns == committed  # the committed file is written only by hand
    sweep_dir = out / "regression"
    table = load_sweep(sweep_dir)
    failed = table.loc[table["status"] != "completed", ["strategy", "workers", "error"]]
    assert failed.empty, f"regression runs failed:\n{failed.to_string()}"
    return code, json.loads((sweep_dir / "regression.json").read_text()), table, sweep_dir


def test_baseline_was_measured_with_this_spec_on_committed_code():
    data = load_baseline(BASELINE)
    spec = load_spec(SPEC)
    assert data["spec_identity"] == spec_identity(spec_dict(spec)), (
        f"{SPEC.name} changed since {BASELINE.name} was measured; refresh it: "
        f"python -m testbed.sweep {SPEC.relative_to(ROOT)} --update-baseline")
    prov = data["provenance"]
    assert prov["git_dirty"] is False and len(prov["git_commit"]) == 40, prov
    assert data["repeats"] >= MIN_REPEATS and data["mode"] == "emulated"


def test_the_curves_pass_the_check(checked):
    code, report, _, sweep_dir = checked
    assert code == 0 and report["passed"], (sweep_dir / "regression.md").read_text()


def test_the_report_covers_every_point(checked):
    _, report, table, sweep_dir = checked
    points = {(r["curve"], r["n"]) for r in report["rows"]}
    assert points == {(s, int(n)) for s, n in zip(table["strategy"], table["workers"], strict=True)}
    assert all(r["band"] >= 0.05 and r["model"] is not None for r in report["rows"])
    assert report["provenance"]["git_commit"] and report["baseline"]["repeats"] >= MIN_REPEATS
    assert (sweep_dir / "regression.md").read_text().startswith("### Scaling-curve regression: PASS")
    assert (sweep_dir / "regression.png").stat().st_size > 0


def test_curve_shapes(checked):
    ratios = curve_ratios(checked[2])
    # N gradients cross one NIC (the driver's, the single PS shard's): ~linear in N (model 3.0).
    for strategy in ("ps-sync", "mapreduce"):
        assert ratios[strategy]["8"] > 2, f"{strategy} T(8)/T(2) = {ratios[strategy]['8']:.2f}"
    # Each ring worker moves 2K(N-1)/N whatever N is: ~flat (model 1.75).
    assert ratios["ring"]["8"] < 2, f"ring T(8)/T(2) = {ratios['ring']['8']:.2f}"


INJECTED_LATENCY = "5ms"  # per message instead of 50 us (model: T(8) 0.235 s -> 0.304 s)


def test_the_check_fails_on_an_injected_slowdown_naming_that_curve(checked, tmp_path):
    """The ring's largest point reruns with every message paying INJECTED_LATENCY (2(N-1) messages
    per step), put in place of its measured point beside this run's other curves (T(2) as
    measured: the ratio T(8)/T(2) grows by 29% in the model) and checked by the same code against
    the committed baseline: only the ring fails. Without it (the fixture's table) the same check
    passes."""
    spec = load_spec(SPEC)
    ring = {k: v[0] for k, v in next(g for g in spec.grids if g["strategy"] == ["ring"]).items()}
    n = max(spec.grid["workers"])
    out = run_strategy(make_config(**{**spec.base, **ring, "workers": n, "steps": 2,
                                      "network.latency": INJECTED_LATENCY}))
    slowed = {"strategy": "ring", "workers": n, "repeat": 0, "status": "completed",
              METRIC: shortest_interval(out["steps"]["t_start"], out["updates"]["t_applied"])}
    table = checked[2]
    keep = (table["strategy"] != "ring") | (table["workers"] != n)
    spliced = pd.concat([table[keep], pd.DataFrame([slowed])], ignore_index=True)
    data = load_baseline(BASELINE)
    code = check_sweep(spec, tmp_path, data, BASELINE, quiet=True, table=spliced)
    report = json.loads((tmp_path / "regression.json").read_text())
    assert code == 1 and not report["passed"]
    assert report["failures"] and all(f.startswith("ring: T(8)/T(2)") for f in report["failures"])
    assert "ring: T(8)/T(2)" in (tmp_path / "regression.md").read_text()
    assert check_sweep(spec, tmp_path, data, BASELINE, quiet=True, table=table) == 0  # and back


@pytest.fixture(scope="module")
def machine_cost(checked):
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


def test_every_point_meets_the_cost_model(checked, machine_cost):
    """Measured communication per step within 10% of the model, plus what the machine measurably
    adds: its own cost of the same step on the real network (divided by the dilation) and what
    the run measured leaking past the emulator (messages that arrived after their emulated
    delivery). Below the model only the 10%: nothing this machine does makes a step faster."""
    table = checked[2]
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
