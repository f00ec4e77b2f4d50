"""Scaling-curve baselines: step-time ratios, their measured spread, provenance. No Ray.

A scaling curve is one strategy's step time as a function of the worker count N. A regression
check compares its *shape*, never absolute seconds (DESIGN section 9): at every N the ratio
T(N)/T(N0) to the smallest N0 of the sweep, per strategy, with T each run's shortest interval
between model updates (`step_time_min_s`, read from the run folders by `load_sweep`).
The shortest, not the mean or the median: emulated transfers are sleeps, and other processes on
the machine can only make a step longer, never shorter, so the minimum is the best estimate of
the uncontended step time (the reasoning behind timeit's min). It also leaves out the first
interval's actor warm-up (a few hundred ms on the parameter server, the same at every N).

Ratios are formed within one repeat (repeat r of every point runs before repeat r+1, so the
runs of one repeat are close in time) and a curve's ratio at N is the median over repeats.

How far a ratio may drift (the band), from what the baseline itself measured:

    band(s, N) = max(BAND_FLOOR, BAND_FACTOR * spread(s, N))
    spread     = standard deviation of the repeats' ratios / their median   (ddof = 1)

A baseline is measured with at least MIN_REPEATS repeats (`--update-baseline` runs
BASELINE_REPEATS unless told otherwise), so every point has a spread; the check itself may run
one repeat. BAND_FACTOR = 4: one new ratio against the median of the baseline's repeats
differs by about 1.1-1.3 standard deviations when nothing changed, and a standard deviation
estimated from a handful of repeats can be half the true one. BAND_FLOOR = 5%: what a ratio
can move from one machine to another although the code did not change (the real cost of a
message, ~0.1-1 ms, is a few percent of an emulated step after dilation; see
experiments/regression.toml), and far below what a real regression does to a curve (an extra
round trip, a serialised transfer or a lost overlap moves a ratio by tens of percent).

Beside the baseline, every curve of an emulated sweep is compared with the alpha-beta cost
model's own ratio (`predicted_step_s`), within MODEL_TOLERANCE = 15%: the model leaves out the
real per-message costs that the emulator adds on top of its sleeps (largest for the ring: 2(N-1)
messages per step), so the measurement may sit a few percent off the theory, but a curve that
leaves the theory by more no longer illustrates what it is meant to. A real-network sweep (no
`network.bandwidth`) has no model ratio; its curves depend on the machine, so a baseline of one
is compared only on the same machine class (`testbed.analysis.provenance.machine_class`).

Refresh the baseline deliberately, never from a test:
    python -m testbed.sweep experiments/regression.toml --update-baseline
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from testbed.analysis.provenance import machine_difference

SCHEMA_VERSION = 2
METRIC = "step_time_min_s"  # measured step time (see the module docstring for why the minimum)
MODEL_METRIC = "predicted_step_s"
MIN_REPEATS = 3
BASELINE_REPEATS = 5
BAND_FLOOR = 0.05
BAND_FACTOR = 4.0
MODEL_TOLERANCE = 0.15
REFRESH = "python -m testbed.sweep experiments/regression.toml --update-baseline"


def refresh(path: str | os.PathLike | None = None, spec: str | os.PathLike | None = None) -> str:
    """The command that measures the baseline at PATH again from SPEC (REFRESH by default)."""
    if path is None and spec is None:
        return REFRESH
    where = "" if path is None else f" --baseline {path}"
    return f"python -m testbed.sweep {spec or 'experiments/regression.toml'} --update-baseline{where}"

Curves = dict[str, dict[str, float]]  # strategy -> {str(N): T(N)/T(N0)}
Spreads = dict[str, dict[str, list[float]]]  # strategy -> {str(N): [ratio of each repeat]}


def step_time_min(run_dir: str | os.PathLike) -> float | None:
    """One run's shortest interval between model updates, the first from the first worker's
    start (the intervals of `testbed.analysis.metrics`); None without updates."""
    updates = pd.read_parquet(Path(run_dir) / "updates.parquet", columns=["t_applied"])
    steps = pd.read_parquet(Path(run_dir) / "steps.parquet", columns=["t_start"])
    return shortest_interval(steps["t_start"], updates["t_applied"])


def shortest_interval(t_start: pd.Series, t_applied: pd.Series) -> float | None:
    """The shortest interval between model updates, the first from the earliest step start."""
    if t_applied.empty or t_start.empty:
        return None
    times = np.sort(t_applied.to_numpy(dtype=float))
    return float(np.diff(np.concatenate([[t_start.min()], times])).min())


def load_sweep(sweep_dir: str | os.PathLike) -> pd.DataFrame:
    """A sweep's runs.parquet (`testbed.results.load_table`) plus `step_time_min_s` per run."""
    from testbed.analysis.results import load_table

    table = load_table(sweep_dir)
    table[METRIC] = [step_time_min(d) if status == "completed" and d else None
                     for d, status in zip(table["run_dir"], table["status"], strict=True)]
    return table


# ---------------------------------------------------------------- ratios


def _values(table: pd.DataFrame, column: str) -> dict[str, dict[int, dict[int, float]]]:
    """{strategy: {N: {repeat: COLUMN}}} over the completed runs."""
    missing = [c for c in ("strategy", "workers", column) if c not in table.columns]
    if missing == [MODEL_METRIC]:
        raise ValueError(f"table has no {MODEL_METRIC}: the cost model predicts only over an "
                         "emulated network; set network.bandwidth in the spec's [base]")
    if missing:
        raise ValueError(f"table has no column {', '.join(missing)}; pass a sweep's runs.parquet")
    rows = table[table["status"] == "completed"] if "status" in table.columns else table
    rows = rows.dropna(subset=[column])
    if "repeat" not in rows.columns:
        rows = rows.assign(repeat=0)
    dup = rows[rows.duplicated(["strategy", "workers", "repeat"], keep=False)]
    if len(dup):
        s, n = dup.iloc[0]["strategy"], int(dup.iloc[0]["workers"])
        raise ValueError(f"table has several runs of {s} at N={n} in one repeat; a scaling "
                         "regression sweep may vary only strategy and workers")
    out: dict[str, dict[int, dict[int, float]]] = {}
    for s, n, r, v in zip(rows["strategy"], rows["workers"], rows["repeat"], rows[column], strict=True):
        out.setdefault(str(s), {}).setdefault(int(n), {})[int(r)] = float(v)
    return out


def repeat_ratios(table: pd.DataFrame, column: str = METRIC) -> Spreads:
    """Per strategy and N, the ratio COLUMN(N)/COLUMN(N0) of every repeat that measured both."""
    out: Spreads = {}
    for strategy, curve in _values(table, column).items():
        n0 = min(curve)
        base = curve[n0]
        bad = [r for r, v in base.items() if not v > 0]
        if bad:
            raise ValueError(f"{strategy}: step time at N={n0} is {base[bad[0]]!r} in repeat "
                             f"{bad[0]}; need > 0")
        out[strategy] = {str(n): [curve[n][r] / base[r] for r in sorted(curve[n]) if r in base]
                         for n in sorted(curve)}
    return out


def _median(ratios: Spreads) -> Curves:
    return {s: {n: float(np.median(v)) for n, v in c.items() if v} for s, c in ratios.items()}


def curve_ratios(table: pd.DataFrame) -> Curves:
    """Per strategy, measured T(N)/T(N0) at every N (N0 = its smallest N), median over repeats."""
    return _median(repeat_ratios(table, METRIC))


def model_ratios(table: pd.DataFrame) -> Curves:
    """The same ratios from the cost model's `predicted_step_s` (emulated network only)."""
    return _median(repeat_ratios(table, MODEL_METRIC))


LATE = "emulation_leak_frac"  # the share of a run's emulated time its messages arrived late


def curve_late(table: pd.DataFrame) -> Curves:
    """Per strategy and N, the median share of emulated time its runs' messages arrived after
    their emulated delivery (`emulation_leak_frac`: the emulator could not keep up); {} for a
    table without it (a real network), nothing for a point whose runs did not record it."""
    if LATE not in table.columns:
        return {}
    return {s: {str(n): float(np.median(list(reps.values()))) for n, reps in sorted(c.items())}
            for s, c in _values(table, LATE).items()}


def spread(values: list[float]) -> float | None:
    """Relative standard deviation (ddof 1) of one point's repeated ratios; None below 2."""
    if len(values) < 2:
        return None
    return float(np.std(values, ddof=1) / np.median(values))


def band(relative_spread: float | None) -> float:
    """The drift a ratio may show from the baseline (module docstring)."""
    return max(BAND_FLOOR, BAND_FACTOR * (relative_spread or 0.0))


def step_times(table: pd.DataFrame) -> Curves:
    """Per strategy, the median measured step time (s) at every N; informational, never compared."""
    return {s: {str(n): float(np.median(list(reps.values()))) for n, reps in sorted(c.items())}
            for s, c in _values(table, METRIC).items()}


# ---------------------------------------------------------------- identity and machine


def spec_identity(spec: Mapping[str, Any]) -> str:
    """Hash of what a spec measures (its `spec_dict` without `repeats`: more repeats of the same
    points measure the same curves)."""
    what = {k: v for k, v in spec.items() if k != "repeats"}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:12]


def machine_change(data: Mapping[str, Any], here: Mapping[str, Any]) -> str | None:
    """Why a baseline of real-network curves cannot be compared on this machine, or None
    (`machine_difference`: MACHINE_CLASS, the same notion a calibration file is checked with).

    Emulated curves (`mode` "emulated") are meant to be machine-independent: always None."""
    if data.get("mode") != "real":
        return None
    return machine_difference(data.get("provenance", {}), here)


# ---------------------------------------------------------------- the file


def write_baseline(path: str | os.PathLike, table: pd.DataFrame,
                   meta: Mapping[str, Any]) -> dict[str, Any]:
    """Write PATH (JSON, atomically) from a sweep table of >= MIN_REPEATS repeats.

    META carries `spec` (the spec_dict), `spec_file` and `provenance`. Refuses (ValueError) a
    point with fewer repeats, and emulated curves that already depart from the cost model: a
    check could never pass against such a baseline.
    """
    from testbed.analysis.results import write_json

    reps = repeat_ratios(table, METRIC)
    few = [f"{s} N={n} ({len(v)})" for s, c in reps.items() for n, v in c.items() if len(v) < MIN_REPEATS]
    if few:
        raise ValueError(f"a baseline needs at least {MIN_REPEATS} completed repeats of every point "
                         f"to measure its spread; {', '.join(few)} had fewer: run with --repeats "
                         f"{BASELINE_REPEATS}")
    measured = _median(reps)
    modelled = MODEL_METRIC in table.columns and table[MODEL_METRIC].notna().any()
    model = model_ratios(table) if modelled else {}
    unmodelled = sorted(set(measured) - set(model))
    if model and unmodelled:
        raise ValueError(f"no cost-model prediction for {', '.join(unmodelled)}; emulate the network "
                         "(network.bandwidth) for every point, or for none")
    problems = [f"{s}: T({n})/T({min(c, key=int)}) is {c[n]:.2f}, cost model {model[s][n]:.2f}"
                for s, c in measured.items() for n in c
                if n in model.get(s, {}) and abs(c[n] / model[s][n] - 1) > MODEL_TOLERANCE]
    if problems:
        raise ValueError("measured curves depart from the cost model by more than "
                         f"{MODEL_TOLERANCE:.0%}: " + "; ".join(problems))
    spreads = {s: {n: spread(v) for n, v in c.items()} for s, c in reps.items()}
    spec = meta.get("spec", {})
    data = {"schema_version": SCHEMA_VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "metric": METRIC, "mode": "emulated" if model else "real",
            "spec": spec, "spec_file": meta.get("spec_file"), "spec_identity": spec_identity(spec),
            "provenance": dict(meta.get("provenance", {})),
            "repeats": min(len(v) for c in reps.values() for v in c.values()),
            "tolerance": {"rule": "band = max(floor, factor * spread); spread = std(ddof=1) / median "
                                  "of the repeats' ratios",
                          "floor": BAND_FLOOR, "factor": BAND_FACTOR, "model": MODEL_TOLERANCE},
            "ratios": _rounded(measured), "spread": _rounded(spreads),
            "band": _rounded({s: {n: band(v) for n, v in c.items()} for s, c in spreads.items()}),
            "model_ratios": _rounded(model), "step_time_s": _rounded(step_times(table))}
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_json(target, data)
    return data


def _rounded(curves: Mapping[str, Mapping[str, float | None]]) -> dict[str, dict[str, float | None]]:
    return {s: {n: None if v is None else round(v, 4) for n, v in c.items()} for s, c in curves.items()}


def load_baseline(path: str | os.PathLike, spec: str | os.PathLike | None = None) -> dict[str, Any]:
    """Read a baseline file; ValueError naming the file and the fix (measure it again from SPEC,
    default experiments/regression.toml) if it is not one, or holds no usable ratio."""
    p = Path(path)
    fix = refresh(p, spec)
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{p}: cannot read the baseline ({exc}); create it with {fix}") from None
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        version = data.get("schema_version") if isinstance(data, dict) else None
        raise ValueError(f"{p}: schema_version {version!r}, expected {SCHEMA_VERSION}; "
                         f"refresh it with {fix}")
    missing = [k for k in ("ratios", "band", "model_ratios", "tolerance", "metric", "mode", "spec",
                           "spec_identity", "provenance") if k not in data]
    if missing:
        raise ValueError(f"{p}: no {', '.join(missing)}; refresh it with {fix}")
    if data["metric"] != METRIC:
        raise ValueError(f"{p}: ratios of {data['metric']!r}, this code compares {METRIC!r}; "
                         f"refresh it with {fix}")
    problem = unusable(data["ratios"])
    if problem:
        raise ValueError(f"{p}: {problem}, so nothing can be compared with it; measure it again "
                         f"with {fix}")
    return data


def usable(ratio: Any) -> bool:
    """Whether a baseline's ratio can be compared with: a finite number > 0 (not NaN, not null)."""
    return (isinstance(ratio, (int, float)) and not isinstance(ratio, bool)
            and math.isfinite(ratio) and ratio > 0)


def unusable(ratios: Any) -> str | None:
    """Why a baseline's `ratios` hold nothing to compare with, or None: not curves of
    {N: ratio}, no curve at all, or not one finite ratio > 0 (every ratio NaN, say)."""
    if not isinstance(ratios, dict) or not all(isinstance(c, dict) and all(str(n).isdigit() for n in c)
                                               for c in ratios.values()):
        return "its ratios are not curves of {N: T(N)/T(N0)}"
    values = [v for c in ratios.values() for v in c.values()]
    if not values:
        return "its ratios hold no curve"
    if not any(usable(v) for v in values):
        return f"none of its {len(values)} ratios is a finite number > 0 (first: {values[0]!r})"
    return None


def describe(data: Mapping[str, Any]) -> list[str]:
    """One line per curve: its ratios beside the cost model's, and each point's band."""
    lines = []
    for strategy, curve in data["ratios"].items():
        n0 = min(map(int, curve))
        model = data["model_ratios"].get(strategy, {})
        bands = data["band"].get(strategy, {})
        parts = [f"T({n})/T({n0}) {r:.2f} ± {bands.get(n, BAND_FLOOR):.0%}"
                 + (f" (model {model[n]:.2f})" if n in model else "")
                 for n, r in curve.items() if int(n) != n0]
        lines.append(f"{strategy}: " + ", ".join(parts))
    return lines
