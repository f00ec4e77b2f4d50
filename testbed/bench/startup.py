"""How long a run takes to start, as a user starts it: the default command and many synthetic workers.

    python -m testbed.bench startup [--cases default,synthetic:64] [--repeats 2] [--steps 20]
        [--out FILE.json]

Each case is a fresh `python -m testbed.run` process (interpreter, imports, its own private Ray,
its actors), run --repeats times one after the other, with `--out` a temporary folder and
`--quiet` (the folder path is all it prints) added:

  default       `python -m testbed.run --strategy ring --workers 8` (the README's main command,
                all its updates and evaluations: its wall is "the whole run").
  synthetic:N   `--strategy ring --workload synthetic --workers N --steps S` (--steps): N
                emulated workers, as many per process as the run chooses.

What is measured, per run: `wall`, the process's start to its exit (timed here); and from the
run's summary the path to its first model update, which adds up by construction:

    first update after launch = launch -> session (interpreter, imports, the config)
                              + Ray (checks, starting the private Ray)
                              + actors (the run folder, the actor processes and their wiring)
                              + first update (the actors' first step)

`per process` is the actors' part over the run's worker processes: start-up grows with
processes, not workers, once several workers share one (docs/emulation.md, "Many workers on one box"). `memory` is the machine's used memory
(MemTotal - MemAvailable, sampled every 0.1 s) at its peak during the run, above what it was
just before; `/ worker` divides it by N. `stderr` counts the lines the run wrote there: a normal
run writes none (Ray's own messages go to the run folder). `steal` is the share of the cores
the hypervisor gave to other guests during the run (/proc/stat): on a virtual machine the same
run takes longer when it is high, and the report says so. The stated goals are checked against
the median of the repeats; `python loop` (10 million empty iterations, timed before the cases)
says how fast this machine's Python is today, since start-up is mostly Python and machines of
the same size differ several-fold in it.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from testbed.config import MAX_WORKERS, ConfigError
from testbed.util.machine import busy_fraction, stolen_cpu_s, used_memory

DEFAULT_CASES = "default,synthetic:64"
DEFAULT_ARGV = ["--strategy", "ring", "--workers", "8"]  # the README's main command
# The goals (first update after launch, whole run) in seconds: (case, figure, bound).
GOALS = [("default", "first_update_after_launch_s", 10.0), ("default", "wall_s", 25.0),
         ("synthetic:64", "first_update_after_launch_s", 20.0)]
STEAL_NOTED = 0.05  # a run that lost more of its cores than this to the hypervisor is named
PARTS = ("startup_ray_s", "startup_actors_s", "startup_first_update_s")  # the summary's, after the session


def add_arguments(sub: Any) -> None:
    a = sub.add_parser("startup", help="start-up of the default command and of many synthetic "
                       "workers, split into its parts").add_argument
    a("--cases", default=DEFAULT_CASES, help="comma-separated: default and/or synthetic:N, e.g. "
      "default,synthetic:64,synthetic:128")
    a("--repeats", type=int, default=2, help="runs of each case, one after the other")
    a("--steps", type=int, default=20, help="model updates of each synthetic:N run")
    a("--timeout", type=float, default=600.0, help="seconds one run may take before it is killed")
    a("--out", default=None, help="also write every run's figures to this JSON file")


def validate(ns: argparse.Namespace, split: Any) -> None:
    """Check the start-up benchmark's options in place (ConfigError with the one-line fix)."""
    cases = []
    for item in split("--cases", ns.cases):
        n = item.removeprefix("synthetic:")
        if item != "default" and not (item.startswith("synthetic:") and n.isdigit()
                                      and 1 <= int(n) <= MAX_WORKERS):
            raise ConfigError(f"--cases {item!r}: use default or synthetic:N with N in 1..{MAX_WORKERS}, "
                              "e.g. default,synthetic:64")
        cases.append(item if item == "default" else f"synthetic:{int(n)}")
    ns.cases = list(dict.fromkeys(cases))
    if ns.repeats < 1:
        raise ConfigError(f"--repeats {ns.repeats!r}: use a positive integer, e.g. 2")
    if ns.steps < 1:
        raise ConfigError(f"--steps {ns.steps!r}: use a positive integer, e.g. 20")
    if not ns.timeout > 0:
        raise ConfigError(f"--timeout {ns.timeout!r}: use a number of seconds > 0, e.g. 600")


def case_argv(case: str, steps: int) -> list[str]:
    if case == "default":
        return list(DEFAULT_ARGV)
    return ["--strategy", "ring", "--workload", "synthetic", "--workers", case.split(":")[1],
            "--steps", str(steps)]


class MemoryPeak:
    """The peak of `used_memory()` while the block runs, above its value when it began (the
    first sample: the peak is never below it)."""

    def __init__(self, every: float = 0.1) -> None:
        self.every = every
        self.base = self.peak = used_memory()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="memory-peak", daemon=True)

    def _sample(self) -> None:
        while True:
            now = used_memory()
            if now is not None:
                self.peak = now if self.peak is None else max(self.peak, now)
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> MemoryPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def above_idle(self) -> int | None:
        return None if self.base is None or self.peak is None else self.peak - self.base


def python_loop_s(iterations: int = 10_000_000) -> float:
    t0 = time.perf_counter()
    for _ in range(iterations):
        pass
    return time.perf_counter() - t0


def measure(case: str, steps: int, timeout: float, folder: str) -> dict[str, Any]:
    """One fresh run of CASE: the process's wall, its summary's start-up split, memory, stderr,
    and the share of the cores the hypervisor took away meanwhile.
    A run that fails or outlives TIMEOUT (then ended like Ctrl-C: its Ray stops too) is a
    RuntimeError naming its last stderr line."""
    from testbed.analysis.results import load_run

    argv = [sys.executable, "-m", "testbed.run", *case_argv(case, steps), "--out", folder, "--quiet"]
    stolen = stolen_cpu_s()
    with MemoryPeak() as mem:
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
            raise RuntimeError(f"the {case} run took over --timeout {timeout:g} s and was stopped; "
                               "give it more seconds") from None
        wall = time.monotonic() - t0
    after = stolen_cpu_s()
    steal = None if stolen is None or after is None else (after - stolen) / (wall * (os.cpu_count() or 1))
    if proc.returncode != 0 or not out.strip():
        last = (err.strip().splitlines() or ["(no message)"])[-1]
        raise RuntimeError(f"the {case} run exited {proc.returncode}: {last}")
    summary = load_run(out.strip().splitlines()[-1])["summary"]
    return {**derive(case, summary, wall, mem.above_idle, err), "steal": steal}


def derive(case: str, summary: dict[str, Any], wall: float, memory: int | None, stderr: str) -> dict[str, Any]:
    """One run's figures from its summary (raw: the keys as the run wrote them) and what was timed here."""
    parts = {k: summary.get(k) for k in PARTS}
    first = summary.get("first_update_after_launch_s")
    known = [v for v in parts.values() if v is not None]
    session = None if first is None or len(known) < len(parts) else first - sum(known)
    workers = summary["workers"]
    processes = summary.get("worker_processes") or workers  # both cases are rings: no servers
    actors = parts["startup_actors_s"]
    return {"case": case, "workers": workers, "processes": processes, "wall_s": wall,
            "first_update_after_launch_s": first, "session_s": session, **parts,
            "per_process_s": None if actors is None else actors / processes,
            "memory_bytes": memory, "memory_per_worker_bytes": None if memory is None else memory / workers,
            "stderr_lines": len(stderr.strip().splitlines()), "stderr": stderr[-2000:], "status": summary.get("status")}


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def goals(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stated goals where this run measured their case: the median over the repeats."""
    out = []
    for case, key, bound in GOALS:
        value = median_of([r for r in runs if r["case"] == case], key)
        if value is not None:
            out.append({"case": case, "figure": key, "value": value, "goal": f"<= {bound:g} s",
                        "met": value <= bound})
    return out


def run_startup(ns: argparse.Namespace) -> dict[str, Any]:
    loop = python_loop_s()
    busy = busy_fraction(1.0)
    runs: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="testbed-startup-") as folder:
        for case in ns.cases:
            for i in range(ns.repeats):
                try:
                    run = measure(case, ns.steps, ns.timeout, folder)
                except RuntimeError as exc:  # the other runs still count: noted, and the exit says so
                    errors.append({"case": case, "repeat": i, "error": str(exc)})
                    print(f"  {case} #{i + 1}: {exc}", file=sys.stderr, flush=True)
                    continue
                run["repeat"] = i
                runs.append(run)
                print(f"  {case} #{i + 1}: first update {_s(run['first_update_after_launch_s'])} s after "
                      f"launch, wall {run['wall_s']:.1f} s", file=sys.stderr, flush=True)
    return {"cores": os.cpu_count(), "python_loop_s": loop, "busy_before": busy, "steps": ns.steps,
            "runs": runs, "errors": errors, "goals": goals(runs)}


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _share(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def report(doc: dict[str, Any]) -> str:
    busy = doc.get("busy_before")
    lines = [f"cores: {doc['cores']}; python loop (10M empty iterations): {doc['python_loop_s']:.2f} s"
             + ("" if busy is None else f"; machine busy before: {busy:.0%}"),
             f"{'case':<14} {'N':>4} {'procs':>5} {'wall':>7} {'1st upd':>7} = {'session':>7} + "
             f"{'Ray':>6} + {'actors':>6} + {'1st':>6}  {'/proc':>6} {'memory':>9} {'/worker':>8} {'stderr':>6} {'steal':>5}"]
    for r in doc["runs"]:
        mem, per = r["memory_bytes"], r["memory_per_worker_bytes"]
        lines.append(f"{r['case']:<14} {r['workers']:>4} {r['processes']:>5} {_s(r['wall_s']):>7} "
                     f"{_s(r['first_update_after_launch_s']):>7} = {_s(r['session_s']):>7} + "
                     f"{_s(r['startup_ray_s']):>6} + {_s(r['startup_actors_s']):>6} + "
                     f"{_s(r['startup_first_update_s']):>6}  {_s(r['per_process_s']):>6} "
                     f"{'-' if mem is None else f'{mem / 2**20:.0f} MiB':>9} "
                     f"{'-' if per is None else f'{per / 2**20:.0f} MiB':>8} {r['stderr_lines']:>6} "
                     f"{_share(r.get('steal')):>5}")
    lines.append("seconds; 1st upd: first model update after launch = session (interpreter, imports, "
                 "config) + Ray + actors + the first update; /proc: actors' part per actor process; "
                 "memory: the machine's peak above idle; steal: the cores' share the hypervisor took")
    stolen = [r for r in doc["runs"] if (r.get("steal") or 0) > STEAL_NOTED]
    if stolen:
        worst = max(stolen, key=lambda r: r["steal"])
        lines.append(f"{len(stolen)} run(s) lost over {STEAL_NOTED:.0%} of the cores to other guests of this "
                     f"virtual machine (up to {worst['steal']:.0%}, {worst['case']} #{worst['repeat'] + 1}): "
                     "their times are this machine's limit, not the testbed's; rerun when it is quiet")
    for g in doc["goals"]:
        lines.append(f"goal {g['case']} {g['figure']}: {g['value']:.2f} s (median; goal {g['goal']}): "
                     f"{'met' if g['met'] else 'MISSED'}")
    lines += [f"error {e['case']} #{e['repeat'] + 1}: {e['error']}" for e in doc["errors"]]
    noisy = [r for r in doc["runs"] if r["stderr_lines"]]
    if noisy:
        lines.append(f"stderr of {noisy[0]['case']} #{noisy[0]['repeat'] + 1} (a normal run writes none): "
                     + noisy[0]["stderr"].strip().splitlines()[0][:200])
    return "\n".join(lines)
