"""Running a sweep: its points through the single-run code path, points.jsonl, the table, the
figures and the checks. The command line and what it does: testbed/sweep/cli.py, whose `main`
calls this module's once the signal handler is in place; the names users import from
`testbed.sweep` live here."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

import testbed.sweep.check as sweepcheck
from testbed.analysis.baseline import BASELINE_REPEATS, MIN_REPEATS
from testbed.analysis.plots import run_tables
from testbed.analysis.results import arrow_safe, load_table, summary_columns, write_sweep_table
from testbed.config import ConfigError
from testbed.sweep.spec import (
    SWEEP_OWNED,
    Point,
    Spec,
    applies,
    config_keys,
    expand,
    flat_config,
    load_spec,
    repeated,
    spec_dict,
    spec_hash,
)
from testbed.util.machine import BUSY_SHARE, busy

__all__ = ["SWEEP_OWNED", "Point", "Spec", "applies", "build_table", "config_keys", "expand",
           "flat_config", "load_spec", "load_table", "main", "read_points", "run_point",
           "run_tables", "spec_dict"]

DEFAULT_BASELINE = "results/baselines/scaling.json"
DESCRIPTION = "A grid of runs from a TOML spec -> one tidy table + figures. Resumable."  # testbed/sweep/cli.py's first line


# ---------------------------------------------------------------- running


def read_points(path: Path) -> dict[str, dict[str, Any]]:
    """points.jsonl -> {point id: its latest record}; a torn last line is ignored."""
    records: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a crash mid-append; that point simply runs again
            if isinstance(rec, dict) and "id" in rec:
                records[rec["id"]] = rec
    return records


def _append(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(record, sort_keys=True, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())  # a finished point must survive a crash of the next one


def run_point(point: Point, runs_dir: Path) -> dict[str, Any]:
    """Execute one point through the single-run code path; return its points.jsonl record."""
    from testbed.session.execute import execute

    attempt = 0
    while (runs_dir / f"{point.point_id}-{attempt}").exists():
        attempt += 1  # a run folder is never overwritten; a retry gets the next name
    run_id = f"{point.point_id}-{attempt}"
    record: dict[str, Any] = {"id": point.point_id, "repeat": point.repeat, "values": point.values}
    try:
        outcome = execute(point.config, run_id=run_id)
    except KeyboardInterrupt:
        return {**record, "status": "interrupted", "run_dir": None, "error": "interrupted"}
    except Exception as exc:  # noqa: BLE001 - one point fails, the sweep goes on
        return {**record, "status": "failed", "run_dir": None, "error": f"{type(exc).__name__}: {exc}"}
    status = {0: "completed", 4: "diverged", 130: "interrupted"}.get(outcome.exit_code, "failed")
    run_dir = f"runs/{outcome.folder.name}" if outcome.folder is not None else None
    return {**record, "status": status, "run_dir": run_dir, "error": outcome.error_line}


def _start_ray(points: list[Point]) -> bool:
    """Start (or attach to) one Ray for the whole sweep; True if this call started it."""
    from testbed.runtime.rayprocs import start_ray

    addresses = {p.config.cluster.address for p in points}
    if len(addresses) > 1:
        raise ConfigError(f"cluster.address {sorted(map(str, addresses))}: one sweep runs on one "
                          "cluster; put cluster.address in [base]")
    return start_ray(addresses.pop(), flag="cluster.address")


def run_all(todo: list[Point], total: int, sweep_dir: Path, quiet: bool, stop_on_failure: bool = False) -> bool:
    """Run the points still to do, appending to points.jsonl; False if interrupted.
    STOP_ON_FAILURE: end after the first run that did not complete (what comes after cannot help)."""
    bar = None
    if not quiet:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=total - len(todo), desc=sweep_dir.name, unit="run",
                   dynamic_ncols=True)
    try:
        for point in todo:
            if bar is not None:
                bar.set_postfix_str(_point_label(point), refresh=True)
            record = run_point(point, sweep_dir / "runs")
            if record["status"] == "interrupted":
                return False  # not recorded: the point runs again on resume
            _append(sweep_dir / "points.jsonl", record)
            if bar is not None:
                bar.update(1)
            if stop_on_failure and record["status"] != "completed":
                print(f"testbed.sweep: {_point_label(point)} ended {record['status']}; a baseline needs "
                      "every run, so the sweep stops here", file=sys.stderr)
                break
    finally:
        if bar is not None:
            bar.close()
    return True


def _point_label(point: Point) -> str:
    return " ".join(f"{k.split('.')[-1]}={v}" for k, v in point.values.items()) + f" #{point.repeat}"


# ---------------------------------------------------------------- table


def build_table(spec: Spec, points: list[Point], records: Mapping[str, dict], sweep_dir: Path,
                families: Mapping[str, str]) -> pd.DataFrame:
    """One row per recorded run of this spec: flattened config + scalar summary metrics."""
    rows = []
    for p in points:
        rec = records.get(p.point_id)
        if rec is None or rec.get("status") not in ("completed", "failed", "diverged"):
            continue
        row: dict[str, Any] = {"sweep": spec.name, "point_id": p.point_id, "repeat": p.repeat,
                               "status": rec["status"], "run_dir": rec.get("run_dir"),
                               "error": rec.get("error"), "family": families.get(p.config.strategy)}
        row.update(flat_config(p.config))
        summary_path = sweep_dir / rec["run_dir"] / "summary.json" if rec.get("run_dir") else None
        if summary_path is not None and summary_path.exists():
            row.update(summary_columns(json.loads(summary_path.read_text())))
        rows.append(row)
    return arrow_safe(pd.DataFrame(rows))


# ---------------------------------------------------------------- CLI


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise ConfigError(message)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = _Parser(prog="python -m testbed.sweep", description=DESCRIPTION)
    p.add_argument("spec", help="experiments/NAME.toml")
    p.add_argument("--out", default="results/sweeps", help="folder that receives <name>/")
    p.add_argument("--quiet", action="store_true", help="no progress bar; print only the folder")
    p.add_argument("--update-baseline", action="store_true",
                   help="after a fully completed sweep, write its step-time ratios to --baseline")
    p.add_argument("--check", action="store_true",
                   help="run afresh and compare every curve with --baseline and the cost model; "
                        "exit 1 on drift")
    p.add_argument("--baseline", default=DEFAULT_BASELINE, metavar="PATH",
                   help=f"baseline file that --update-baseline writes and --check reads "
                        f"(default {DEFAULT_BASELINE})")
    p.add_argument("--allow-machine-change", action="store_true",
                   help="--check a real-network baseline measured on another machine class")
    p.add_argument("--repeats", type=int, default=None, metavar="N",
                   help="repeats of every point, instead of the spec's (--update-baseline: at least "
                        f"{MIN_REPEATS}, default {BASELINE_REPEATS})")
    p.add_argument("--yes", action="store_true",
                   help=f"run a grid of more than {ASK_ABOVE_POINTS} runs without asking")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from testbed.strategies import registry

    try:
        args = _parse(argv)
        spec = sweepcheck.with_repeats(load_spec(args.spec), args)
        reference = sweepcheck.baseline_for_check(spec, args) if args.check else None
        sweep_dir = Path(args.out) / spec.name
        families = registry.families()
        points, skipped = expand(spec, registry.SPECS, str(sweep_dir / "runs"))
        _check_size(points, args.yes, args.quiet)
        _warn_calibrations(points)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        with SweepLock(sweep_dir, spec):
            return _main(args, spec, sweep_dir, families, points, skipped, reference)
    except (ConfigError, OSError) as exc:
        print(f"testbed.sweep: error: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace, spec: Spec, sweep_dir: Path, families: Mapping[str, str],
          points: list[Point], skipped: list[dict], reference: dict[str, Any] | None) -> int:
    records = read_points(sweep_dir / "points.jsonl")
    for s in skipped:  # recorded once, so points.jsonl says why a combination did not run
        sid = hashlib.sha256(json.dumps(s["values"], sort_keys=True).encode()).hexdigest()[:12]
        if sid not in records:
            _append(sweep_dir / "points.jsonl", {"id": sid, "status": "skipped", **s})
    fresh = args.update_baseline or args.check  # measured now, by this code, not from old runs
    todo = [p for p in points if fresh or not _done(records.get(p.point_id), sweep_dir)]
    code = _finish(spec, points, todo, skipped, sweep_dir, families, args.quiet,
                   stop_on_failure=args.update_baseline)
    if args.update_baseline:
        code = sweepcheck.update_baseline(spec, sweep_dir, Path(args.baseline), code, args.quiet)
    elif reference is not None and code != 130:
        code = sweepcheck.check_sweep(spec, sweep_dir, reference, args.baseline, args.quiet, say=False)
        if code == 1:  # confirm: a real slowdown drifts again, a busy moment does not
            print("testbed.sweep: a curve drifted; every point runs once more to confirm it", file=sys.stderr)
            again = repeated(points, spec)
            code = _finish(spec, points + again, again, skipped, sweep_dir, families, args.quiet)
        if code != 130:
            code = sweepcheck.check_sweep(spec, sweep_dir, reference, args.baseline, args.quiet)
    return code


ASK_ABOVE_POINTS = 200  # a grid this large needs --yes when a person is at the terminal


def _warn_calibrations(points: list[Point]) -> None:
    """One stderr line per calibration file of the sweep measured on another machine class."""
    from testbed.analysis.provenance import calibration_machine_change

    for path in sorted({p.config.network.calibration for p in points} - {None}):
        change = calibration_machine_change(path)
        if change:
            print(f"testbed.sweep: warning: {change}", file=sys.stderr)


def _check_size(points: list[Point], yes: bool, quiet: bool) -> None:
    """Say how large the sweep is before it starts; refuse a huge one at a terminal without --yes."""
    if not quiet or len(points) > ASK_ABOVE_POINTS:
        steps = sum(p.config.steps * p.config.workers for p in points)
        print(f"testbed.sweep: {len(points)} runs, {steps} worker iterations in all", file=sys.stderr)
    if len(points) > ASK_ABOVE_POINTS and not yes and sys.stdin.isatty():
        raise ConfigError(f"the grid has {len(points)} runs (more than {ASK_ABOVE_POINTS}); add --yes "
                          "to run them all, or shrink the grid")


class SweepLock:
    """One sweep at a time in a folder, and one spec per folder.

    An exclusive lock on <sweep>/.lock (released by the OS if the process dies) keeps two
    sweeps from running the same points at once; <sweep>/spec.json records the spec the
    folder belongs to, and a different spec under the same name is refused.
    """

    def __init__(self, sweep_dir: Path, spec: Spec) -> None:
        self.dir, self.spec = sweep_dir, spec
        self.fh: Any = None

    def __enter__(self) -> SweepLock:
        import fcntl

        self.fh = open(self.dir / ".lock", "a+")
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.fh.close()
            raise ConfigError(f"{self.dir}: another sweep is running there; wait for it to end or use "
                              "another --out") from None
        mine = {"hash": spec_hash(self.spec), "spec": spec_dict(self.spec)}
        held = self.dir / "spec.json"
        if held.exists():
            theirs = json.loads(held.read_text())
            if theirs.get("hash") != mine["hash"]:
                self.__exit__()
                raise ConfigError(f"{self.dir} holds the runs of another spec named {self.spec.name!r} "
                                  f"(spec {theirs.get('hash')}, this one {mine['hash']}); give this spec "
                                  "another name or --out, or delete that folder")
        else:
            from testbed.analysis.results import write_json

            write_json(held, mine)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fh is not None:
            self.fh.close()  # closing the file releases the lock
            self.fh = None


def _done(record: dict[str, Any] | None, sweep_dir: Path) -> bool:
    """Completed (or diverged: a result too), and its run folder still has a summary (a deleted
    folder runs again)."""
    return bool(record and record.get("status") in ("completed", "diverged") and record.get("run_dir")
                and (sweep_dir / record["run_dir"] / "summary.json").exists())


def _finish(spec: Spec, points: list[Point], todo: list[Point], skipped: list[dict],
            sweep_dir: Path, families: Mapping[str, str], quiet: bool, stop_on_failure: bool = False) -> int:
    from testbed.runtime.rayprocs import stop_ray
    from testbed.session.interrupts import INTERRUPTS

    started, complete = False, True
    with INTERRUPTS as interrupts:
        try:
            if todo:
                with interrupts.deferred():
                    started = _start_ray(todo)
            complete = run_all(todo, len(points), sweep_dir, quiet, stop_on_failure)
        except ConfigError as exc:
            print(f"testbed.sweep: error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            complete = False
        finally:
            with interrupts.shielded():
                if started:
                    stop_ray()  # only the Ray this sweep started
        with interrupts.shielded():  # the table and figures of what ran are written whatever comes
            return _write_results(spec, points, todo, skipped, sweep_dir, families, quiet, complete)


def _write_results(spec: Spec, points: list[Point], todo: list[Point], skipped: list[dict],
                   sweep_dir: Path, families: Mapping[str, str], quiet: bool, complete: bool) -> int:
    records = read_points(sweep_dir / "points.jsonl")
    table = build_table(spec, points, records, sweep_dir, families)
    write_sweep_table(table, sweep_dir / "runs.parquet",
                      {"name": spec.name, "grid": list(spec.grid), "repeats": spec.repeats})
    _figures(sweep_dir)
    failed = int((table["status"] == "failed").sum()) if len(table) else 0
    _warn_unfaithful(table)
    if not quiet:
        print(f"{spec.name}: {len(table)} runs ({len(table) - failed} completed, {failed} failed), "
              f"{len(points) - len(todo)} reused, {len(skipped)} skipped as duplicates")
    print(sweep_dir)
    return 130 if not complete else (1 if failed else 0)


def _warn_unfaithful(table: pd.DataFrame) -> None:
    """One line naming the runs whose emulation was not faithful (`emulation_faithful` false:
    communication off the model by more than 5%, or the emulator late): their numbers are in the
    table, and what they say about the emulated cluster is unresolved on this machine."""
    if "emulation_faithful" not in table.columns:
        return
    off = table[table["emulation_faithful"].eq(False)]
    if off.empty:
        return
    labels = [f"{r.strategy} N={r.workers} #{r.repeat}" for r in off.itertuples()]
    shown = ", ".join(labels[:5]) + (f" and {len(labels) - 5} more" if len(labels) > 5 else "")
    loaded = sum(map(busy, off["foreign_cpu_share"])) if "foreign_cpu_share" in off.columns else 0
    busy_note = (f", {loaded} of them while other processes used {BUSY_SHARE:.0%} of the CPUs or more "
                 "(foreign_cpu_share)") if loaded else ""
    print(f"testbed.sweep: warning: {len(off)} of {len(table)} runs were not faithful ({shown}{busy_note}): their "
          "emulated times carry this machine's own cost (emulation_faithful false in runs.parquet); give "
          "them network.dilation = \"auto\" (the default when left out) and a larger "
          "network.fidelity_budget_s, or rerun on a quieter machine",
          file=sys.stderr)


def _figures(sweep_dir: Path) -> None:
    from testbed.analysis import plots

    table = load_table(sweep_dir)
    if table.empty:
        return
    try:
        plots.figures_for_sweep(table, sweep_dir / "figures", steps_by_label=run_tables(table, "steps"),
                                updates_by_label=run_tables(table, "updates"))
    except Exception as exc:  # noqa: BLE001 - the table is written; say why figures are not
        print(f"testbed.sweep: warning: figures not drawn ({type(exc).__name__}: {exc})",
              file=sys.stderr)
