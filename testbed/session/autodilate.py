"""--dilation auto: short trial runs raise the dilation until the run is faithful, then the run
goes at that factor. The policy and its arithmetic are pure (testbed.emulation.dilation: why the
search measures as it goes instead of trusting one run's advice, and a worked schedule).

    trial     the config at factor D for TRIAL_STEPS updates (x N for asynchronous strategies),
              quiet, without held-out evaluation or injected faults, into
              <out>/<run id>.dilation-search/ (moved into the run's folder as dilation-search/);
              a run no longer than a trial and without --fail is tried whole (its own steps,
              evaluation and timeline), so its last trial *is* the run: that folder becomes the
              run's, and the run is not repeated (the search's last row names it)
    fewer     where the budget cuts the factor the search would raise D to (a next trial and the
              run at it would not both fit in --fidelity-budget, estimated from the trials' own
              start-up and step times) and the run can have emulated peers
              (testbed.emulation.peers), the next trial has half the real workers at the same
              factor instead, while a trial still fits and there is more than one
    stop      a faithful trial; a trial that says raising D cannot help; a budget that buys no
              larger factor and no trial with fewer real workers
    first     D = 1, or less where the cost model says the first trial and the run would last
              more than half the budget at 1 (`model_seconds`, testbed.emulation.dilation's
              `first_factor`: faster than real time)
    timeout   each trial and the run wait --timeout times their factor, if above 1 (`dilated`)
    the run   at the faithful trial's factor, else at the largest factor measured; its summary
              adds `dilation_search` (one row per trial), `dilation_search_result` (one line) and
              `dilation_search_s`; `emulation_faithful` says, as for every emulated run, whether
              the run itself was faithful; the result line says where other processes used at
              least BUSY_SHARE of the CPUs in a trial (`foreign_cpu_share`, each trial's row)

One Ray serves the trials and the run (started here when none is up), so each trial costs its
actors' start-up and its steps, not Ray's.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.analysis.results import new_run_id, write_json
from testbed.config import RunConfig, with_overrides
from testbed.config.environment import MIN_DILATION
from testbed.config.faultspec import Faults
from testbed.emulation.dilation import (
    FIDELITY_TOLERANCE,
    TRIAL_STEPS,
    affordable_factor,
    faithful,
    first_factor,
    next_factor,
)
from testbed.util.machine import busy

MIN_RAISE = 1.25  # a capped next factor below this multiple of the current one is not worth a trial
CEILING = 100_000.0  # --dilation's own upper limit


def execute_auto(cfg: RunConfig, execute: Callable[..., Any], *, run_id: str | None = None,
                 launched: float | None = None, start: float | None = None) -> Any:
    """Search a factor for cfg (its --dilation auto), then run cfg at it; the run's Outcome.
    `execute`: testbed.session.execute.execute, which runs each trial and the run. `start`: the
    first trial's factor (None for a run: `first_factor` of the model's emulated time, 1 unless
    the run is long; the map's checks start where their step lasts a second)."""
    from testbed.runtime.rayprocs import start_ray, stop_ray
    from testbed.session.interrupts import INTERRUPTS

    run_id = run_id or new_run_id(cfg.strategy, cfg.workers)
    search_dir = Path(cfg.out) / f"{run_id}.dilation-search"
    started = False
    with INTERRUPTS as interrupts:
        try:
            try:
                with interrupts.deferred():
                    started = start_ray(cfg.cluster.address)
            except Exception:  # noqa: BLE001 - the run below reports why Ray cannot start, as any run does
                started = False
            t0 = time.monotonic()
            if start is None:
                start = first_factor(model_seconds(cfg), cfg.network.fidelity_budget_s, MIN_DILATION)
            cfg, factor, trials, result, last = _search(cfg, search_dir, t0, execute, start)
            if last is not None and last.exit_code == 130:  # interrupted during a trial: the command ends
                return last
            annotate = {"dilation_search": trials, "dilation_search_result": result,
                        "dilation_search_s": time.monotonic() - t0}
            if last is not None:  # the last trial ran the whole run at the run's factor: it is the run
                with interrupts.shielded():
                    outcome = _promote(last, dilated(cfg, factor), run_id, annotate)
            else:
                outcome = execute(dilated(cfg, factor), run_id=run_id,
                                  launched=launched, annotate=annotate)
        finally:
            with interrupts.shielded():
                if started:
                    stop_ray()
    if outcome.folder is not None and search_dir.is_dir():
        shutil.move(str(search_dir), str(outcome.folder / "dilation-search"))
    return outcome


def dilated(cfg: RunConfig, factor: float, **more: Any) -> RunConfig:
    """cfg at --dilation `factor`, its --timeout stretched as much: every wait of a run dilated D
    times lasts D times longer, so the factor the search picks must not turn the run's own
    waits into hangs. Below 1 it stays: a wait is no shorter than on this machine's own clock."""
    return with_overrides(cfg, **{"network.dilation": factor,
                                  "cluster.timeout_s": cfg.cluster.timeout_s * max(1.0, factor)}, **more)


def model_seconds(cfg: RunConfig) -> float | None:
    """The emulated time the search's first trial and the run after it would last by the cost
    model (the spec's own prediction, as the map makes it before any run: compute plus
    communication per worker iteration, times the iterations), or None where the model has no
    prediction. Where the first trial is the whole run, the run's alone."""
    from testbed.analysis.costmodel import NotModelled
    from testbed.strategies.registry import SPECS
    from testbed.workloads import tensor_plan

    spec = SPECS[cfg.strategy]
    if cfg.network.bandwidth_Bps is None:
        return None
    try:
        sizes, shares = tensor_plan(cfg.workload, seed=cfg.seed)
        comm = spec.predict(cfg, spec.plan(cfg, sizes, shares), cfg.network.latency_s, cfg.network.bandwidth_Bps).comm_s
    except (NotModelled, ValueError, KeyError):
        return None
    per_step, whole, trial_steps = _trials(cfg)

    def rounds(updates: int) -> int:
        return -(-updates // per_step)

    iterations = rounds(cfg.steps) if whole else rounds(trial_steps) + rounds(cfg.steps)
    return iterations * (cfg.workload.compute_ms / 1000.0 + comm)


def _trials(cfg: RunConfig) -> tuple[int, bool, int]:
    """(updates per round of every worker's iteration, whether a trial is the whole run, a
    trial's updates): TRIAL_STEPS rounds, or the run where it is no longer and has no --fail."""
    from testbed.strategies.registry import SPECS

    per_step = 1 if SPECS[cfg.strategy].synchronous(cfg) else cfg.workers
    whole = cfg.steps <= TRIAL_STEPS * per_step and not cfg.faults.fail.items
    return per_step, whole, min(cfg.steps, TRIAL_STEPS * per_step)


def _promote(trial: Any, cfg: RunConfig, run_id: str, annotate: dict[str, Any]) -> Any:
    """The faithful whole-run trial becomes the run: its folder moves to <out>/<run_id>, its
    config.json says the run's config (cfg, at the factor found), its summary gains the search."""
    folder = Path(cfg.out) / run_id
    shutil.move(str(trial.folder), str(folder))
    annotate["dilation_search"][-1]["run_id"] = run_id
    saved = json.loads((folder / "config.json").read_text())
    write_json(folder / "config.json", {**saved, "config": cfg.to_dict()})
    summary = {**json.loads((folder / "summary.json").read_text()), **annotate, "run_id": run_id}
    write_json(folder / "summary.json", summary)
    shown = {**(trial.summary or {}), **annotate, "run_id": run_id}
    return dataclasses.replace(trial, folder=folder, summary=shown)


def fewer_real_workers(cfg: RunConfig) -> RunConfig | None:
    """cfg with half its real workers (the rest emulated peers, testbed.emulation.peers), or None
    where it has one, or cannot have emulated peers: what the search tries when the budget cuts
    the factor it would raise to, since fewer real workers cost this machine less per step."""
    from testbed.strategies.registry import SPECS

    k = cfg.real_workers
    if (k <= 1 or not cfg.network.emulated or cfg.faults.fail.items
            or SPECS[cfg.strategy].cannot_emulate_peers(cfg) is not None):
        return None
    per_process = min(cfg.cluster.workers_per_process or 1, k // 2)
    return with_overrides(cfg, **{"cluster.real_workers": k // 2, "cluster.workers_per_process": per_process})


def busy_note(trials: list[dict[str, Any]]) -> str:
    """What the result line says of other processes' load where it was heavy in a trial (at least
    BUSY_SHARE of the CPUs): their contention is what the factor paid for, as much as this run's
    own cost, so a quieter machine is faithful at a smaller one; else nothing."""
    shares = [t["foreign_cpu_share"] for t in trials if t.get("foreign_cpu_share") is not None]
    if not any(busy(share) for share in shares):
        return ""
    return (f"; other processes used up to {max(shares):.0%} of this machine's CPUs during the trials "
            "(a quieter machine needs a smaller factor)")


def _search(cfg: RunConfig, search_dir: Path, t0: float, execute: Any,
            start: float = 1.0) -> tuple[RunConfig, float, list[dict[str, Any]], str, Any]:
    """(the config for the run, its factor, trial rows, the one-line result, Outcome or None): the
    Outcome of an interrupted trial, or of the last trial where each trial ran the whole run (the
    run goes at the last trial's factor, so that trial is the run, faithful or not). Where the
    budget cuts the factor it would raise to, the search goes on with half the real workers (the
    others emulated peers) at the same factor, while there are fewer to have."""
    _, whole, trial_steps = _trials(cfg)
    budget = cfg.network.fidelity_budget_s
    trials: list[dict[str, Any]] = []
    factor = float(start)
    while True:
        start = time.monotonic()
        if whole:  # the run itself, quiet: if faithful, it is the run
            trial = dilated(cfg, factor, out=str(search_dir), quiet=True)
        else:
            trial = dilated(cfg, factor, steps=trial_steps, out=str(search_dir), quiet=True, timeline=False,
                            **{"eval.every": 0, "faults.fail": Faults()})
        outcome = execute(trial)
        if outcome.exit_code == 130:
            return cfg, factor, trials, "interrupted", outcome
        s = outcome.summary or {}
        row = {"dilation": factor, "status": s.get("status", "failed"),
               "emulation_fidelity": s.get("emulation_fidelity"), "emulation_leak_frac": s.get("emulation_leak_frac"),
               "step_time_mean_s": s.get("step_time_mean_s"), "wall_s": time.monotonic() - start,
               "run_id": outcome.folder.name if outcome.folder else None, "real_workers": cfg.real_workers,
               "foreign_cpu_share": s.get("foreign_cpu_share"), "emulation_compute_ratio": s.get("emulation_compute_ratio")}
        row["faithful"] = faithful(row["emulation_fidelity"], row["emulation_leak_frac"], row["emulation_compute_ratio"])
        trials.append(row)
        if row["status"] != "completed":
            return cfg, factor, trials, f"a trial at --dilation {factor:g} ended {row['status']}: {outcome.error_line}", None

        def stop(result: str, factor: float = factor, outcome: Any = outcome,
                 cfg: RunConfig = cfg) -> tuple[RunConfig, float, list[dict[str, Any]], str, Any]:
            """The run goes at this trial's factor: where the trial was the whole run, it is the run."""
            result += busy_note(trials)
            if whole:
                return cfg, factor, trials, f"{result}; the last trial was the run", outcome
            return cfg, factor, trials, result, None

        if row["faithful"] is None:
            return stop(f"a trial at --dilation {factor:g} measured no fidelity (no prediction beside it)")
        if row["faithful"]:
            return stop(f"faithful at --dilation {factor:g} ({len(trials)} trials)")
        fid, leak, compute = row["emulation_fidelity"], row["emulation_leak_frac"], row["emulation_compute_ratio"]
        measured = f"at --dilation {factor:g} a trial measured {fid:.3g}x the model's communication"
        if compute is not None and compute > 1 + FIDELITY_TOLERANCE:
            measured += f" and {compute:.3g}x its compute"
        nxt = next_factor(factor, fid, leak, CEILING, compute=compute)
        if nxt is None:
            return stop(f"not faithful: {measured}, and more dilation cannot help (below the model by more "
                        "than the emulator ran late: compare the summary's formula with the schedule)")
        step_s = float(row["step_time_mean_s"] or 0.0)
        setup_s = max(0.0, row["wall_s"] - trial_steps * step_s * factor)
        after = 0 if whole else cfg.steps  # a whole trial leaves no run to pay for after it
        left = budget - (time.monotonic() - t0)
        wanted, nxt = nxt, affordable_factor(nxt, trial_steps, after, step_s, setup_s, left)
        fewer = fewer_real_workers(cfg)
        if nxt < wanted and fewer is not None and affordable_factor(
                factor, trial_steps, after, step_s, setup_s, left) >= factor:
            # the budget cuts the raise: the same factor, half the real workers, costs this machine
            # about half as much per step without slowing the emulated clock
            cfg = fewer
            continue
        if nxt < factor * MIN_RAISE:
            return stop(f"not faithful: {measured}; --fidelity-budget {budget:g} s buys no larger factor "
                        "(raise it, or use fewer workers)")
        factor = nxt
