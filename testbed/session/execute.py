"""Execute one validated RunConfig: folder, cluster, strategy, records, summary.

Shared by `testbed.run` and `testbed.sweep` so that a sweep point runs exactly the code path
of a single run. All that is strategy-specific comes from the strategy's spec
(`testbed.strategies.registry`).

Nothing measured is lost and nothing hangs:
- every record goes to the run folder's records.jsonl the moment it arrives;
- however the run ends, the summary is written first (from records already in memory, no Ray
  call), then the strategy's actors and Ray are stopped within a bounded time;
- Ctrl-C, SIGTERM and SIGHUP, to the process or its group, at any moment, end it as
  "interrupted" (exit 130; `testbed.session.interrupts`).

    status       exit  when
    completed    0     every update applied, parameters finite
    failed       1     an error (one line in summary.json's `error`, the traceback in error.txt),
                       or a file could not be written (disk full, read-only)
    failed       2     the cluster cannot run the config (resources, address)
    failed       3     restarts exhausted, a parameter-server shard lost for good
    diverged     4     past --max-skipped non-finite gradients, --on-nan stop met one, or the
                       final parameters or the last update's loss are not finite
    interrupted  130   a signal
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from testbed.analysis.evals import eval_points, eval_summary
from testbed.analysis.predict import predictions
from testbed.analysis.records import EVAL_COLUMNS, STEP_COLUMNS, UPDATE_COLUMNS, Recorder
from testbed.analysis.results import OutputError, RunFolder, chrome_trace, new_run_id, table_frame
from testbed.config import ConfigError, RunConfig
from testbed.emulation.faults import (
    Diverged,
    NonFiniteGradient,
    RestartsExhausted,
    ServerLost,
    not_reached,
)
from testbed.emulation.peers import weights
from testbed.runtime.cluster import Cluster
from testbed.runtime.rayprocs import RayMessages, silence_stderr
from testbed.runtime.reaper import end_ray_processes, end_ray_processes_after_exit
from testbed.session.evaluation import Evaluator
from testbed.session.interrupts import INTERRUPTS, Interrupts
from testbed.strategies.contract import StrategySpec
from testbed.util.machine import CpuWindow

SHUTDOWN_S = 60.0  # stopping the actors and Ray after a run that ended normally
SHUTDOWN_INTERRUPTED_S = 5.0  # ... and after a signal or a failure (Ray may be half gone)
STARTUP_STUCK_S = 10.0  # Ray still starting this long after a signal (a busy machine: 3 at once take 15 s): give it up


@dataclass
class Outcome:
    exit_code: int
    folder: Path | None
    summary: dict[str, Any] | None
    error_line: str | None = None
    clean: bool = True  # False: Ray could not be stopped in time; the process should exit at once


def _progress(cfg: RunConfig):
    if cfg.quiet:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.steps, desc=f"{cfg.strategy} N={cfg.workers}", unit="upd",
                leave=False, dynamic_ncols=True)


def execute(cfg: RunConfig, *, run_id: str | None = None, launched: float | None = None,
            annotate: dict[str, Any] | None = None) -> Outcome:
    """Run cfg. `launched`: when the process started (`testbed.run`), for the start-up figures;
    `annotate`: summary fields the caller measured about this run (the --dilation auto search).
    A config with --dilation auto goes through the search (testbed.session.autodilate), which
    comes back here with a number in its place."""
    if cfg.network.auto_dilation:
        from testbed.session.autodilate import execute_auto

        return execute_auto(cfg, execute, run_id=run_id, launched=launched)
    from testbed.strategies import registry

    spec = registry.SPECS[cfg.strategy]
    cluster = Cluster(cfg.cluster, workers=cfg.real_workers, servers=spec.servers(cfg),
                      torch_workers=cfg.workload.imports_torch, colocated=spec.colocated_servers(cfg),
                      gpu_exclusive=spec.cannot_share_gpu(cfg), workload=cfg.workload)
    with INTERRUPTS as interrupts:
        return _Run(spec, cfg, cluster, run_id or new_run_id(cfg.strategy, cfg.workers), interrupts,
                    launched, annotate).execute()


class _Ended:
    """How a run ended: status, exit code, one-line reason."""

    def __init__(self) -> None:
        self.status, self.code, self.error = "completed", 0, None
        self.cause: BaseException | None = None

    def set(self, status: str, code: int, error: str | None, cause: BaseException | None = None) -> None:
        self.status, self.code, self.error, self.cause = status, code, error, cause


class _Run:
    """One run while it executes: its cluster and strategy, its folder, record log, progress bar
    and evaluator as they come up, the recorder, and how it ended (`ended`)."""

    def __init__(self, spec: StrategySpec, cfg: RunConfig, cluster: Any, run_id: str, interrupts: Interrupts,
                 launched: float | None, annotate: dict[str, Any] | None = None) -> None:
        self.spec, self.cfg, self.cluster, self.run_id, self.interrupts = spec, cfg, cluster, run_id, interrupts
        self.annotate = annotate or {}
        self.ended = _Ended()
        self.folder: RunFolder | None = None
        self.log: Any = None
        self.bar: Any = None
        self.evaluator: Evaluator | None = None
        self.strategy: Any = None
        self.recorder = Recorder(max_skipped=cfg.faults.max_skipped)
        self.params: Any = None
        self.extra: dict[str, Any] = {}
        self.cpu: CpuWindow | None = None  # the machine's CPU while the strategy trains
        self.load: dict[str, Any] | None = None
        self.marks: dict[str, float | None] = {"launched": launched, "session": time.time()}  # start-up milestones

    def execute(self) -> Outcome:
        try:
            with self.interrupts.deferred(STARTUP_STUCK_S, self.stuck):  # an interrupt inside ray.init would leave half a cluster
                self.start_ray()
            with self.interrupts.deferred():  # no run folder without its log, no half-attached evaluator
                self.open_folder()
                self.start()
            self.train()
        except (KeyboardInterrupt, SystemExit):  # SystemExit: Ray's own SIGTERM handler, set inside ray.init
            self.ended.set("interrupted", 130, f"interrupted by {self.interrupts.name or 'SIGTERM'}; "
                                               "what was measured is saved")
        except Exception as exc:  # noqa: BLE001 - the run fails or diverges, the records stay
            self.failed(exc)
        finally:
            if self.evaluator is not None:
                self.evaluator.stop()
            if self.bar is not None:
                self.bar.close()
        if self.ended.status == "completed":
            _check_finite(self.params, self.recorder, self.ended)
            _faults_not_reached(self.cfg, self.recorder)
        return self.save()

    def start_ray(self) -> None:
        """Ray: the one step a signal must not cut in half, and the only one the watchdog of a
        stuck start (`stuck`) covers."""
        self.cluster.precheck_local()
        self.cluster.start()
        self.marks["ray"] = time.time()

    def open_folder(self) -> None:
        """The run folder, its config and its record log (after Ray: a cluster that cannot run
        this leaves no run behind)."""
        cfg = self.cfg
        try:
            self.folder = RunFolder.create(cfg.out, self.run_id)
        except OSError as exc:
            raise ConfigError(f"--out {cfg.out!r}: cannot create the run folder ({exc}); pick another --out") from None
        self.folder.write_config(cfg.to_dict())
        self.log = self.folder.record_log()

    def start(self) -> None:
        """Ray's messages into the folder, the progress bar, the recorder and the evaluator."""
        cfg, cluster = self.cfg, self.cluster
        RayMessages.to(self.folder.path / "ray.log")
        bar = self.bar = _progress(cfg)
        self.recorder = Recorder(sink=self.log, on_update=(lambda _u: bar.update(1)) if bar else None,
                                 max_skipped=cfg.faults.max_skipped)
        placed = cluster.bundle_nodes()  # asked of Ray once here, again only after a fault
        self.recorder.locate(cluster.worker_nodes, known=cluster.worker_nodes(placed))
        self.recorder.extra.update(cluster.facts(), actor_nodes=len(set(placed.values())))
        self.evaluator = Evaluator(cfg, self.recorder, on_result=_show_eval(bar))
        self.evaluator.attach()  # held-out evaluations, off the critical path (testbed.session.evaluation)

    def train(self) -> None:
        cfg = self.cfg
        self.strategy = self.spec.create(cfg, self.cluster, run_id=self.run_id, workdir=str(self.folder.path))
        self.strategy.setup()
        self.marks["actors"] = time.time()
        self.recorder.dilate(cfg.network.factor, origin=self.marks["actors"])  # the emulated cluster's clock
        self.cpu = CpuWindow()
        self.strategy.run(self.recorder)
        self.load = self.cpu.shares()
        self.evaluator.finish(cfg.cluster.timeout_s)  # the versions still queued (the actors hold PS snapshots)
        self.params = self.strategy.parameters()
        self.extra = self.strategy.summary_extra()

    def failed(self, exc: Exception) -> None:
        """How an error ends the run: its status, exit code and line (the module docstring's table)."""
        if isinstance(exc, ConfigError):
            self.ended.set("failed", 2, str(exc))
        elif isinstance(exc, (Diverged, NonFiniteGradient)):
            self.ended.set("diverged", 4, str(exc).splitlines()[0])
        elif isinstance(exc, (RestartsExhausted, ServerLost)):
            self.ended.set("failed", 3, str(exc))
        elif isinstance(exc, OutputError):
            self.ended.set("failed", 1, str(exc), exc)
        else:
            self.ended.set("failed", 1, _one_line(exc))
            if self.folder is not None:
                try:
                    (self.folder.path / "error.txt").write_text(traceback.format_exc())
                except OSError:
                    pass

    def stuck(self) -> None:
        """Ray could not finish starting after a signal: say so, and have its processes ended
        once this one has gone (called from the watchdog, which then exits 130). Nothing was
        measured yet: the run folder comes after Ray, and the watchdog and the end of Ray's
        start exclude each other."""
        self.ended.set("interrupted", 130, f"interrupted by {self.interrupts.name} while Ray was starting "
                                           f"(it did not finish within {STARTUP_STUCK_S:g} s)")
        stderr = silence_stderr()  # what Ray prints as it is cut off mid-start is not the run's
        os.write(stderr, f"testbed.run: error: {self.ended.error}\n".encode())
        end_ray_processes_after_exit()  # from here, its raylet's end would end this process with code 1

    def save(self) -> Outcome:
        """The summary first, whatever arrives now, then the actors and Ray within a bounded time."""
        with self.interrupts.shielded():
            summary = None
            if self.log is not None:
                if self.load is None and self.cpu is not None:  # training ended early: what it had
                    self.load = self.cpu.shares()
                extra = {**self.recorder.summary_extras(self.extra), **(self.load or {}), **self.annotate}
                summary = finish(self.folder, self.spec, self.cfg, self.recorder, self.ended, self.params, extra, self.marks,
                                 self.evaluator)
                self.log.close()
            completed = self.ended.status == "completed"
            clean = shut_down(self.strategy, self.cluster, SHUTDOWN_S if completed else SHUTDOWN_INTERRUPTED_S)
            RayMessages.to(None)
        return Outcome(self.ended.code, self.folder.path if self.folder else None, summary, self.ended.error,
                       clean)


def _check_finite(params: Any, recorder: Recorder, ended: _Ended) -> None:
    """A run that applied every update can still have diverged: its parameters or its last loss."""
    if params is not None and not all(np.isfinite(np.asarray(v)).all() for v in params.values()):
        ended.set("diverged", 4, "the final parameters are not finite; lower --lr")
    elif recorder.updates and not np.isfinite(max(recorder.updates, key=lambda u: u["version"])["loss"]):
        ended.set("diverged", 4, "the loss of the last update is not finite; lower --lr")


def _faults_not_reached(cfg: RunConfig, recorder: Recorder) -> None:
    """Record a `fault-not-reached` for each --fail item this completed run never got to (its
    `error` is the line `testbed.run` prints): whether a worker reaches iteration `at` only the
    run can tell when workers share --steps unevenly (asynchronous strategies)."""
    missed = not_reached(cfg.faults.fail.items, recorder.steps, recorder.updates,
                         recorder.extra.get("faults", []))
    now = time.time()
    for fault, line in missed:
        actor = f"worker{fault.index}" if fault.target == "worker" else f"ps{fault.index}"
        recorder.fault("fault-not-reached", actor, fault.at, now, now, fault=fault.to_text(), error=line)


def _one_line(exc: BaseException) -> str:
    from testbed.runtime.remote import describe

    return describe(exc)


def shut_down(strategy: Any, cluster: Any, timeout: float) -> bool:
    """Kill the strategy's actors and stop Ray, in a thread given `timeout` seconds, or longer
    while Ray's daemons are alive and the stop is progressing (a busy machine); a Ray whose
    daemons a signal took can block for a minute instead, and is left then. True if it finished."""
    def work() -> None:
        try:
            if strategy is not None:
                strategy.teardown()
        finally:
            cluster.stop()

    thread = threading.Thread(target=work, name="testbed-shutdown", daemon=True)
    thread.start()
    thread.join(timeout)
    deadline = time.monotonic() + SHUTDOWN_S
    while thread.is_alive() and cluster.daemons_alive() and time.monotonic() < deadline:
        thread.join(0.5)
    if thread.is_alive() and cluster.started_ray:  # leaving without Ray's own shutdown: end its processes
        end_ray_processes()
    return not thread.is_alive()


def _show_eval(bar: Any) -> Any:
    """The progress bar's latest held-out evaluation."""
    if bar is None:
        return None

    def show(rec: Any) -> None:
        acc = "" if rec.eval_acc is None else f", acc {rec.eval_acc:.3f}"
        bar.set_postfix_str(f"eval@{rec.version} loss {rec.eval_loss:.4f}{acc}", refresh=False)
    return show


def finish(folder: RunFolder, spec: StrategySpec, cfg: RunConfig, recorder: Recorder, ended: _Ended,
           params: Any, extra: dict[str, Any], marks: dict[str, float | None],
           evaluator: Any = None) -> dict[str, Any]:
    """Write the record tables and the parameters, then the summary: it says how the run ended,
    including a file that could not be written (the summary itself last, when it still can be)."""
    steps = table_frame(recorder.steps, STEP_COLUMNS)
    updates = table_frame(recorder.updates, UPDATE_COLUMNS)
    points = eval_points(table_frame(recorder.evals, EVAL_COLUMNS), updates, steps, cfg.workload.batch_size)
    folder.release_reserve()  # the space set aside at the start is for what is written now
    try:
        if isinstance(ended.cause, OutputError):  # the disk is full: keep the room for the summary;
            raise ended.cause  # the tables can be rebuilt from records.jsonl (`load_run`)
        folder.write_records(recorder)
        folder.write_evals(points)
        if params is not None:
            folder.write_params(params)
        if cfg.timeline and recorder.events:
            t0 = min(e["t0"] for e in recorder.events)
            folder.write_timeline(chrome_trace(recorder.events, t0))
    except OutputError as exc:
        if ended.status in ("completed", "diverged"):
            ended.set("failed", 1, str(exc))
    summary = summarize_run(spec, cfg, steps, updates, extra, ended.status)
    summary.update(eval_summary(points, cfg.eval.target_loss, cfg.eval.target_acc,
                                evaluator.optimum if evaluator is not None else None))
    summary["eval_every"] = cfg.eval.interval(cfg.steps)
    summary["eval_error"] = evaluator.error if evaluator is not None else None
    summary["run_id"] = folder.path.name
    summary["elapsed_s"] = time.time() - marks["session"]
    summary.update(startup(marks, float(steps["t_start"].min()) if len(steps) else None, recorder.first_update_at))
    summary["error"] = ended.error
    try:
        folder.write_summary(summary)
    except OutputError as exc:
        if ended.status == "completed":
            ended.set("failed", 1, str(exc))
    return summary


def startup(marks: dict[str, float | None], first_start: float | None,
            first_update: float | None) -> dict[str, float | None]:
    """Where the time before training went (real seconds, never dilated)."""
    def span(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else b - a

    return {
        # Ray start-up, actor processes, imports, placement: until the first worker iteration
        "startup_s": span(marks["session"], first_start),
        "startup_ray_s": span(marks["session"], marks.get("ray")),
        "startup_actors_s": span(marks.get("ray"), marks.get("actors")),
        "startup_first_update_s": span(marks.get("actors"), first_update),
        "first_update_after_launch_s": span(marks["launched"], first_update),
    }


def summarize_run(spec: StrategySpec, cfg: RunConfig, steps: Any, updates: Any, extra: dict[str, Any],
                  status: str) -> dict[str, Any]:
    """The summary of one run from its records: statistics, the model beside them, extras."""
    from testbed.analysis.metrics import summarize

    summary = summarize(steps, updates, strategy=cfg.strategy, workers=cfg.workers, status=status,
                        weights=weights(cfg.workers, cfg.real_workers))
    summary["real_workers"] = cfg.real_workers
    summary["workload"] = cfg.workload.name
    summary["tensors"] = tensor_count(cfg.workload)
    summary["dilation"] = cfg.network.factor
    nodes = steps["node"].dropna() if "node" in steps else ()  # (run folders before the column)
    summary["worker_nodes"] = int(nodes.nunique()) if len(nodes) else None
    summary.update(predictions(spec, cfg, summary, steps, updates, extra))
    summary.update(extra)
    return summary


def tensor_count(workload: Any) -> int | None:
    """Gradient tensors of a synthetic workload (plain, or a profile's); None for a torch model
    (counting its tensors would build it on the driver)."""
    if workload.profile is not None:
        from testbed.workloads.profiles import load_profile

        return len(load_profile(workload.profile).names)
    if not workload.real_compute:
        from testbed.workloads.synthetic import TENSORS

        return TENSORS
    return None
