"""The scaling-curve regression commands of `python -m testbed.sweep`: --update-baseline and
--check (what they do: testbed/sweep/cli.py's docstring; the comparison: testbed.analysis.baseline
and testbed.analysis.regression). The sweep runs the points; this module decides how many
repeats, refuses a baseline that cannot apply before Ray starts, writes the baseline, and
compares and reports.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.analysis.baseline import BASELINE_REPEATS, MIN_REPEATS
from testbed.config import ConfigError
from testbed.sweep.spec import Spec, spec_dict, spec_hash


def with_repeats(spec: Spec, args: argparse.Namespace) -> Spec:
    """The spec with --repeats applied (and a baseline's minimum); ConfigError before Ray."""
    if args.check and args.update_baseline:
        raise ConfigError("--check and --update-baseline: pick one (measure a baseline, or check "
                          "against one)")
    n = args.repeats
    if n is not None and not 1 <= n <= 1000:
        raise ConfigError(f"--repeats {n}: must be an integer in 1..1000, e.g. {BASELINE_REPEATS}")
    if args.update_baseline:
        n = max(BASELINE_REPEATS, spec.repeats) if n is None else n
        if n < MIN_REPEATS:
            raise ConfigError(f"--repeats {n}: a baseline needs at least {MIN_REPEATS} repeats to "
                              f"measure each point's spread; use --repeats {BASELINE_REPEATS}")
    return spec if n is None else dataclasses.replace(spec, repeats=n)


def baseline_for_check(spec: Spec, args: argparse.Namespace) -> dict[str, Any]:
    """The baseline --check compares with, refused before Ray if it cannot apply here."""
    from testbed.analysis.baseline import load_baseline, machine_change
    from testbed.analysis.provenance import provenance

    try:
        data = load_baseline(args.baseline, args.spec)
    except ValueError as exc:
        raise ConfigError(f"--baseline {exc}") from None
    if data["spec_identity"] != spec_hash(spec):
        raise ConfigError(f"--baseline {args.baseline} was measured with another spec than {args.spec} "
                          f"(spec {data['spec_identity']}, this one {spec_hash(spec)}); refresh it: "
                          f"python -m testbed.sweep {args.spec} --update-baseline --baseline {args.baseline}")
    change = machine_change(data, provenance())
    if change and not args.allow_machine_change:
        raise ConfigError(f"--baseline {args.baseline} holds real-network curves of another machine "
                          f"class ({change}); measure a baseline on this machine with --update-baseline, "
                          "or pass --allow-machine-change")
    return data


def update_baseline(spec: Spec, sweep_dir: Path, path: Path, code: int, quiet: bool) -> int:
    """Write the CI baseline from this sweep's table; refuse unless every run completed."""
    if code != 0:
        print(f"testbed.sweep: error: baseline {path} not written: the sweep exited {code}, "
              "so some runs did not complete; fix them and rerun with --update-baseline",
              file=sys.stderr)
        return code
    from testbed.analysis import baseline
    from testbed.analysis.provenance import provenance

    meta = {"spec": spec_dict(spec), "spec_file": str(spec.path), "provenance": provenance()}
    if meta["provenance"].get("git_dirty"):
        print(f"testbed.sweep: warning: the tree has uncommitted changes; {path} records that "
              "(commit first, then measure, for a baseline others can trace)", file=sys.stderr)
    try:
        data = baseline.write_baseline(path, baseline.load_sweep(sweep_dir), meta)
    except (ValueError, OSError) as exc:
        print(f"testbed.sweep: error: baseline {path} not written: {exc}", file=sys.stderr)
        return 1
    if not quiet:
        print("\n".join(baseline.describe(data)))
    print(path)
    return 0


def check_sweep(spec: Spec, sweep_dir: Path, data: Mapping[str, Any], baseline_path: str | os.PathLike,
                quiet: bool, table: pd.DataFrame | None = None, say: bool = True) -> int:
    """Compare the sweep's curves (or TABLE's) with DATA; write the report; 0 pass, 1 drift.
    SAY: print the table, the failures and the report's path (False: a first look, before the
    points run again to confirm a drift)."""
    from testbed.analysis import baseline, regression
    from testbed.analysis.provenance import provenance

    table = baseline.load_sweep(sweep_dir) if table is None else table
    try:
        measured, late = baseline.curve_ratios(table), baseline.curve_late(table)
    except ValueError as exc:
        if say:
            print(f"testbed.sweep: error: {exc}", file=sys.stderr)
        return 1
    rows = regression.check(measured, data, late)
    context = {"spec_name": spec.name, "spec_identity": spec_hash(spec), "repeats": spec.repeats,
               "baseline_path": str(baseline_path), "provenance": provenance(),
               "refresh": baseline.refresh(baseline_path, spec.path)}
    report = regression.write_report(sweep_dir, rows, data, context)
    if not say:
        return 0 if report["passed"] else 1
    if not quiet:
        print(regression.text_table(rows))
    for line in report["failures"]:
        print(f"testbed.sweep: regression: {line}", file=sys.stderr)
    print(sweep_dir / "regression.md")
    return 0 if report["passed"] else 1
