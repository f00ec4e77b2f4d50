"""Spot checks: a few cells run as emulated experiments, measured beside predicted.

Which cells. The map's answer is least certain where two families come close: a cell's
`margin_other` (the best of another family over the winner) is 0 on a crossover line. The
checked cells are the K - K//4 cells nearest a crossover (smallest margin_other) and the K//4
farthest from one, among the cells whose winner and runner-up this machine can host in
reasonable time (`hostable`); those two run in each. When fewer than K cells qualify, the rest
are filled by cells whose winner or runner-up cannot run here, each with the two best-ranked
configurations that can (nearest a crossover first), so that K cells are checked where K can be;
cells none of whose pairs can run (more than MAX_WORKERS workers) are counted with the reason.

How. Each run is the configuration's own validated config on the cell's emulated link, through
`testbed.session.execute` (the code path of `testbed.run`), for `STEPS` worker iterations (STEPS
updates of a synchronous step, STEPS x N of asynchronous ones, one worker's gradient each), with:

- `--payload scaled:F`, F = PHYSICAL_BYTES / K: every byte count and emulated transfer uses the
  logical gradient, so the physical arrays only cost memory and copies;
- `--dilation auto` (testbed.session.autodilate, the search every run gets by default), its
  first trial at D = REAL_STEP_S / predicted step (a whole factor from 1 on, two significant
  digits below 1, at least --dilation's 0.01), where the emulated step lasts about a real
  second: beside it this machine's own cost per message shrinks D-fold, and a cell whose step
  lasts minutes (ps or mapreduce at 1 Gbit/s) is checked faster than real time
  (docs/emulation.md, "Fidelity at scale"); the search raises D while the trial is not faithful,
  within CHECK_BUDGET_S. A check is no longer than a trial, so its last trial is the check.

A check is `ok` when the run completed, was faithful and its step is within TOLERANCE of the
prediction; otherwise it is `off` with the reason, and the map marks the cell. Records go to
checks.jsonl in the map's folder keyed by the run config, so a rerun reuses them.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.config import Payload, RunConfig, with_overrides
from testbed.config.environment import AUTO, MIN_DILATION
from testbed.emulation.dilation import LEAK_LIMIT
from testbed.map.table import whole_rounds
from testbed.strategies.registry import SPECS
from testbed.util.machine import busy

TOLERANCE = 0.10  # measured step within 10% of the predicted step
STEPS = 3  # worker iterations per check run: the step time is their median (sync) or mean (async) interval
PHYSICAL_BYTES = 2**20  # arrays that travel: 1 MiB (the fidelity sweeps' 100 MiB at scaled:0.01)
REAL_STEP_S = 1.0  # a dilated step of about this many real seconds (see the module docstring)
MAX_DILATION = 1000.0
# Worker processes plus server actors one check may start: on 2 cores each costs about 0.5 s to
# start and 90-100 MiB (docs/emulation.md, "Many workers on one box"); 24 start in about 12 s.
MAX_PROCESSES = 24
# Workers a checked cell may have. Beyond 16, every ring round costs this machine's cores Python
# time per peer for each of its 2(N-1) rounds, so a faithful check needs a dilation that takes
# minutes per check (docs/emulation.md, "Fidelity at scale").
MAX_WORKERS = 16
# The real seconds one check's dilation search may take (--fidelity-budget of its run); past it
# the check stays off, with the search's reason.
CHECK_BUDGET_S = 90.0


def hostable(cfg: RunConfig) -> bool:
    """Whether this machine can run a check of cfg in reasonable time (MAX_PROCESSES, MAX_WORKERS)."""
    return why_not(cfg) is None


def why_not(cfg: RunConfig) -> str | None:
    """Why this machine cannot check cfg (MAX_WORKERS, MAX_PROCESSES), or None."""
    if cfg.workers > MAX_WORKERS:
        return f"{cfg.workers} workers (at most {MAX_WORKERS} here)"
    if processes(cfg) > MAX_PROCESSES:
        return f"{processes(cfg)} processes (at most {MAX_PROCESSES} here)"
    return None


def processes(cfg: RunConfig) -> int:
    """Processes a run of cfg starts: its worker processes and its servers."""
    return -(-cfg.workers // (cfg.cluster.workers_per_process or 1)) + SPECS[cfg.strategy].servers(cfg)


def select(cells: pd.DataFrame, k: int, pairs: Any) -> tuple[pd.DataFrame, dict[str, int]]:
    """K cells to check, and {reason: cells} of those that cannot be. `pairs(cell)` gives the two
    configurations to run and None (the winner and runner-up), or the two best this machine can
    host and a note saying why not the first two (a fill), or a string: why none can run.

    The K - K//4 cells nearest a crossover and the K//4 farthest from one are taken among those
    whose winner and runner-up can run (see the module docstring); when fewer than K are, the
    rest fills with fill cells, nearest a crossover first, so that K checks run where K can."""
    top, fill, left = [], [], {}
    for _, c in cells.iterrows():
        got = pairs(c)
        if isinstance(got, str):
            left[got] = left.get(got, 0) + 1
            continue
        (labels, note) = got
        if note is None and pd.isna(c["margin_other"]):
            note = "no configuration of another family is ranked here"
        (top if note is None else fill).append({**c.to_dict(), "runs": tuple(labels), "fill": note})
    order = ["margin_other", "workers"]
    top_df = pd.DataFrame(top, columns=[*cells.columns, "runs", "fill"]).sort_values(order, kind="stable", na_position="last")
    near = top_df.head(k - k // 4)
    far = top_df.drop(near.index).tail(k // 4)
    parts = [near.assign(chosen="near a crossover"), far.assign(chosen="far from one")]
    short = k - len(near) - len(far)
    if short > 0 and fill:
        more = pd.DataFrame(fill).sort_values(order, kind="stable", na_position="last").head(short)
        parts.append(more.assign(chosen=["fill: " + n for n in more["fill"]]))
    return pd.concat(parts, ignore_index=True), left


def per_step(cfg: RunConfig) -> int:
    """Model updates per worker iteration of all workers: 1 for a synchronous step, N for
    asynchronous updates (one worker's gradient each)."""
    return 1 if SPECS[cfg.strategy].synchronous(cfg) else cfg.workers


def dilation_for(predicted_step_s: float) -> float:
    """The first trial's factor: where the dilated step lasts about REAL_STEP_S."""
    wanted = REAL_STEP_S / predicted_step_s
    if wanted < 1:
        return max(MIN_DILATION, float(f"{wanted:.2g}"))
    return float(min(MAX_DILATION, math.ceil(wanted)))


def check_config(cfg: RunConfig, predicted_step_s: float, k_bytes: float, runs_dir: Path) -> RunConfig:
    """cfg as a check runs it: few steps, scaled payload, the dilation searched, into runs_dir
    (its first trial's factor: `dilation_for` the predicted step)."""
    scale = min(1.0, PHYSICAL_BYTES / k_bytes)
    # STEPS worker iterations of every worker, in whole rounds of a strategy that communicates
    # on some iterations only (the map predicted its steady state: table.whole_rounds)
    cfg = whole_rounds(SPECS[cfg.strategy], cfg, STEPS * per_step(cfg))
    return with_overrides(cfg, out=str(runs_dir), quiet=True,
                          **{"workload.payload": Payload(scale), "network.dilation": AUTO,
                             "network.fidelity_budget_s": CHECK_BUDGET_S})


def config_key(cfg: RunConfig) -> str:
    data = cfg.to_dict()
    data.pop("out", None)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_records(path: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line: that run runs again
            out[rec["key"]] = rec
    return out


def judge(cfg: RunConfig, predicted_step_s: float, summary: dict[str, Any] | None, status: str,
          error: str | None) -> dict[str, Any]:
    """Measured beside predicted, and the verdict with its reason. Pure."""
    out: dict[str, Any] = {"measured_step_s": None, "ratio": None, "leak": None, "fidelity": None,
                           "verdict": "off", "reason": None}
    if status != "completed" or not summary or summary.get("step_time_p50_s") is None:
        out["reason"] = f"the run ended {status}" + (f": {error}" if error else "")
        return out
    # a synchronous update is one step of all N workers: its median interval is the step. An
    # asynchronous one is one worker's gradient, N of them per worker iteration (the map's step),
    # arriving in bursts whose median interval says little: their mean interval times N
    # (a strategy that communicates on some iterations only: its mean interval, as it is predicted)
    if per_step(cfg) == 1 and SPECS[cfg.strategy].period(cfg) == 1:
        measured = float(summary["step_time_p50_s"])
    else:
        measured = float(summary.get("step_time_mean_s") or summary["step_time_p50_s"]) * per_step(cfg)
    out.update(measured_step_s=measured, ratio=measured / predicted_step_s,
               leak=summary.get("emulation_leak_frac"), fidelity=summary.get("emulation_fidelity"))
    own = summary.get("predicted_step_s")
    reasons = []
    if own is not None and not math.isclose(own, predicted_step_s, rel_tol=1e-6):
        reasons.append(f"the run predicted {own:.4g} s, the map {predicted_step_s:.4g} s (their plans differ)")
    if out["leak"] is not None and out["leak"] > LEAK_LIMIT and out["ratio"] < 1:  # advice()'s reading of a leak
        reasons.append(f"not faithful: the emulator ran late by {out['leak']:.2f}x the predicted communication "
                       f"per update (limit {LEAK_LIMIT})")
    if abs(out["ratio"] - 1) > TOLERANCE:
        reasons.append(f"measured {measured:.4g} s per step is {out['ratio']:.2f}x the predicted {predicted_step_s:.4g} s "
                       f"(tolerance {TOLERANCE:.0%})")
    searched = summary.get("dilation_search_result") or ""
    if reasons and searched.startswith("not faithful"):
        reasons.append(f"the dilation search: {searched}")
    foreign = summary.get("foreign_cpu_share")
    if reasons and busy(foreign):  # their contention is in what it measured
        reasons.append(f"other processes used {foreign:.0%} of this machine's CPUs during the check; rerun it when quiet")
    out["verdict"], out["reason"] = ("off", "; ".join(reasons)) if reasons else ("ok", None)
    return out


def run_one(cfg: RunConfig, start: float = 1.0) -> tuple[str, dict[str, Any] | None, str | None, str | None]:
    """(status, summary, error line, run folder) of one run through the single-run code path;
    `start`: the first factor its --dilation auto search tries."""
    from testbed.session.autodilate import execute_auto
    from testbed.session.execute import execute

    try:
        outcome = execute_auto(cfg, execute, start=start) if cfg.network.auto_dilation else execute(cfg)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - one check fails, the map goes on
        return "failed", None, f"{type(exc).__name__}: {exc}", None
    status = {0: "completed", 4: "diverged", 130: "interrupted"}.get(outcome.exit_code, "failed")
    if status == "interrupted":
        raise KeyboardInterrupt
    return status, outcome.summary, outcome.error_line, str(outcome.folder) if outcome.folder else None


def run_checks(todo: list[dict[str, Any]], out_dir: Path, quiet: bool) -> dict[str, dict[str, Any]]:
    """Run every check not yet in checks.jsonl; return all records by key. `todo`: dicts with
    cfg (RunConfig), predicted_step_s, k_bytes and the row's label and cell."""
    path = out_dir / "checks.jsonl"
    records = read_records(path)
    pending = [t for t in todo if t["key"] not in records]
    run_logged([(t["key"], f"{t['label']} N={t['workers']} {t['bandwidth']}", lambda t=t: _check(t, out_dir))
                for t in pending], records, path, total=len(todo), desc="checks", quiet=quiet)
    return records


def run_logged(jobs: list[tuple[str, str, Any]], records: dict[str, dict[str, Any]], path: Path, *,
               total: int, desc: str, quiet: bool) -> None:
    """Run each (key, label, job) in one Ray, appending its record to `path` (JSON lines) and to
    `records` as it ends, so a rerun reuses what finished; a progress bar unless quiet. A signal
    ends it with what finished kept (the next run goes on from there)."""
    if not jobs:
        return
    from testbed.runtime.rayprocs import start_ray, stop_ray
    from testbed.session.interrupts import INTERRUPTS

    bar = None
    if not quiet:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=total - len(jobs), desc=desc, unit="run", dynamic_ncols=True)
    started = False
    with INTERRUPTS as interrupts:
        try:
            with interrupts.deferred():
                started = start_ray(None, flag="cluster.address")
            for key, label, job in jobs:
                if bar is not None:
                    bar.set_postfix_str(label, refresh=True)
                records[key] = rec = job()
                with open(path, "a") as fh:
                    fh.write(json.dumps(rec, sort_keys=True, default=str) + "\n")
                if bar is not None:
                    bar.update(1)
        except KeyboardInterrupt:
            print(f"testbed.map: interrupted; finished runs are in {path.name}: run again to go on", file=sys.stderr)
            raise
        finally:
            with interrupts.shielded():
                if bar is not None:
                    bar.close()
                if started:
                    stop_ray()


def _check(t: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """One check: its run (the dilation searched from `dilation_for` its step), judged; `tries`:
    the search's trials (factor, fidelity, leak, faithful, folder)."""
    cfg = check_config(t["cfg"], t["predicted_step_s"], t["k_bytes"], out_dir / "runs")
    status, summary, error, folder = run_one(cfg, start=dilation_for(t["predicted_step_s"]))
    judged = judge(cfg, t["predicted_step_s"], summary, status, error)
    tries = [{k: row.get(k) for k in ("dilation", "emulation_fidelity", "emulation_leak_frac", "faithful", "run_id")}
             for row in (summary or {}).get("dilation_search", [])]
    return {"key": t["key"], "label": t["label"], "latency": t["latency"], "bandwidth": t["bandwidth"],
            "workers": t["workers"], "predicted_step_s": t["predicted_step_s"],
            "payload": str(cfg.workload.payload), "tries": tries, "run_dir": folder,
            "dilation": (summary or {}).get("dilation"), **judged}
