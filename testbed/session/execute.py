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
from testbed.analysis.records import EVAL_COLUMNS, STEP_COLUMNS, UPDATE_COLUMNS, Recorder
from testbed.analysis.results import OutputError, RunFolder, chrome_trace, new_run_id, table_frame
from testbed.config import ConfigError, RunConfig
from testbed.config.calibration import load_calibration
from testbed.emulation.dilation import advice
from testbed.emulation.faults import (
    Diverged,
    NonFiniteGradient,
    RestartsExhausted,
    ServerLost,
    not_reached,
)
from testbed.runtime.cluster import Cluster
from testbed.runtime.rayprocs import RayMessages, end_ray_processes, silence_stderr
from testbed.session.evaluation import Evaluator
from testbed.session.interrupts import INTERRUPTS, Interrupts
from testbed.strategies.contract import NotModelled, StrategySpec

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


def execute(cfg: RunConfig, *, run_id: str | None = None, launched: float | None = None) -> Outcome:
    """Run cfg. `launched`: when the process started (`testbed.run`), for the start-up figures."""
    from testbed.strategies import registry

    spec = registry.SPECS[cfg.strategy]
    cluster = Cluster(cfg.cluster, workers=cfg.workers, servers=spec.servers(cfg),
                      torch_workers=cfg.workload.imports_torch, colocated=spec.colocated_servers(cfg),
                      gpu_exclusive=spec.cannot_share_gpu(cfg), workload=cfg.workload)
    with INTERRUPTS as interrupts:
        return _execute(spec, cfg, cluster, run_id or new_run_id(cfg.strategy, cfg.workers), interrupts, launched)


class _Ended:
    """How a run ended: status, exit code, one-line reason."""

    def __init__(self) -> None:
        self.status, self.code, self.error = "completed", 0, None
        self.cause: BaseException | None = None

    def set(self, status: str, code: int, error: str | None, cause: BaseException | None = None) -> None:
        self.status, self.code, self.error, self.cause = status, code, error, cause


def _execute(spec: StrategySpec, cfg: RunConfig, cluster: Any, run_id: str, interrupts: Interrupts,
             launched: float | None) -> Outcome:
    ended, folder, log, bar, evaluator = _Ended(), None, None, None, None
    recorder, strategy, params, extra = Recorder(max_skipped=cfg.faults.max_skipped), None, None, {}
    t_start = time.time()
    marks = {"launched": launched, "session": t_start}  # start-up milestones (wall clock)
    def stuck() -> None:  # Ray could not finish starting after a signal: save and say so, from the watchdog
        ended.set("interrupted", 130, f"interrupted by {interrupts.name} while Ray was starting "
                                      f"(it did not finish within {STARTUP_STUCK_S:g} s)")
        stderr = silence_stderr()  # what Ray prints as it is cut off mid-start is not the run's
        if log is not None:
            finish(folder, spec, cfg, recorder, ended, None, {}, marks)
        end_ray_processes()
        os.write(stderr, f"testbed.run: error: {ended.error}\n".encode())
        if folder is not None:
            print(folder.path, flush=True)

    try:
        with interrupts.deferred(STARTUP_STUCK_S, stuck):  # an interrupt inside ray.init would leave half a cluster
            cluster.precheck_local()
            cluster.start()  # before the folder: a cluster that cannot run this leaves no run behind
            marks["ray"] = time.time()
            try:
                folder = RunFolder.create(cfg.out, run_id)
            except OSError as exc:
                raise ConfigError(f"--out {cfg.out!r}: cannot create the run folder ({exc}); pick another --out") from None
            folder.write_config(cfg.to_dict())
            log = folder.record_log()
            RayMessages.to(folder.path / "ray.log")
            bar = _progress(cfg)
            recorder = Recorder(sink=log, on_update=(lambda _u: bar.update(1)) if bar else None,
                                max_skipped=cfg.faults.max_skipped)
            placed = cluster.bundle_nodes()  # asked of Ray once here, again only after a fault
            recorder.locate(cluster.worker_nodes, known=cluster.worker_nodes(placed))
            recorder.extra.update(cluster.facts(), actor_nodes=len(set(placed.values())))
            evaluator = Evaluator(cfg, recorder, on_result=_show_eval(bar))
            evaluator.attach()  # held-out evaluations, off the critical path (testbed.session.evaluation)
        strategy = spec.create(cfg, cluster, run_id=run_id, workdir=str(folder.path))
        strategy.setup()
        marks["actors"] = time.time()
        recorder.dilate(cfg.network.dilation, origin=marks["actors"])  # the emulated cluster's clock
        strategy.run(recorder)
        evaluator.finish(cfg.cluster.timeout_s)  # the versions still queued (the actors hold PS snapshots)
        params = strategy.parameters()
        extra = strategy.summary_extra()
    except (KeyboardInterrupt, SystemExit):  # SystemExit: Ray's own SIGTERM handler, set inside ray.init
        ended.set("interrupted", 130, f"interrupted by {interrupts.name or 'SIGTERM'}; what was measured is saved")
    except ConfigError as exc:
        ended.set("failed", 2, str(exc))
    except (Diverged, NonFiniteGradient) as exc:
        ended.set("diverged", 4, str(exc).splitlines()[0])
    except (RestartsExhausted, ServerLost) as exc:
        ended.set("failed", 3, str(exc))
    except OutputError as exc:
        ended.set("failed", 1, str(exc), exc)
    except Exception as exc:  # noqa: BLE001 - the run fails, the records stay
        ended.set("failed", 1, _one_line(exc))
        if folder is not None:
            try:
                (folder.path / "error.txt").write_text(traceback.format_exc())
            except OSError:
                pass
    finally:
        if evaluator is not None:
            evaluator.stop()
        if bar is not None:
            bar.close()
    if ended.status == "completed":
        _check_finite(params, recorder, ended)
        _faults_not_reached(cfg, recorder)
    with interrupts.shielded():  # what was measured is saved whatever arrives now
        summary = None
        if log is not None:
            summary = finish(folder, spec, cfg, recorder, ended, params, recorder.summary_extras(extra), marks,
                             evaluator)
            log.close()
        clean = shut_down(strategy, cluster, SHUTDOWN_S if ended.status == "completed" else SHUTDOWN_INTERRUPTED_S)
        RayMessages.to(None)
    return Outcome(ended.code, folder.path if folder else None, summary, ended.error, clean)


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

    summary = summarize(steps, updates, strategy=cfg.strategy, workers=cfg.workers, status=status)
    summary["workload"] = cfg.workload.name
    summary["tensors"] = tensor_count(cfg.workload)
    summary["dilation"] = cfg.network.dilation
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


def critical_comm_s(steps: Any, updates: Any) -> float:
    """Median step interval minus the median of each step's slowest compute (sync strategies).

    What is not the slowest worker's compute is communication (and coordination) on the
    critical path. Medians keep the first, warm-up step from dominating short runs. It can
    come out negative (compute that overlapped communication); it is not clamped.
    """
    t = np.sort(updates["t_applied"].to_numpy(dtype=float))
    intervals = np.diff(np.concatenate([[float(steps["t_start"].min())], t]))
    return float(np.median(intervals)) - float(slowest_compute(steps).median())


def _network_link(spec: StrategySpec, cfg: RunConfig, nodes: int) -> tuple[tuple[float, float], str] | str:
    """((latency s, bandwidth B/s), where they come from) for the cost model, or why there are none:
    the emulated network's settings, or a real network's calibration for this strategy's path --
    its inter-node link when the run's actors sit on more than one node (`nodes`): every
    strategy's step then waits on messages that cross nodes, the slower link."""
    net = cfg.network
    if net.emulated:
        return (net.latency_s, net.bandwidth_Bps), "emulated network"
    if net.calibration is None:
        return ("real network: its latency and bandwidth are unknown; emulate one (--bandwidth, "
                "--latency) or measure this one (python -m testbed.bench network --out FILE, then "
                "--calibration FILE) for the cost model's time")
    cal = load_calibration(net.calibration)
    path = spec.message_path(cfg)
    if path not in cal.links:
        return (f"calibration {net.calibration} has no '{path}' path (this run's messages take it; "
                f"it holds {', '.join(sorted(cal.links))}); measure it with python -m testbed.bench network")
    link, said = cal.link(path, across=nodes > 1)
    return (link.alpha_s, link.bandwidth_Bps), said


def slowest_compute(steps: Any) -> Any:
    """Per iteration, the slowest worker's compute plus injected delay."""
    return (steps["compute_s"] + steps["injected_delay_s"]).groupby(steps["iteration"]).max()


def predictions(spec: StrategySpec, cfg: RunConfig, summary: dict[str, Any], steps: Any, updates: Any,
                extra: dict[str, Any]) -> dict[str, Any]:
    """The cost model beside the measurement: bytes always; time whenever the network's alpha and
    beta are known (emulated). Where there is no prediction, `prediction_missing` says why.

    A prediction is a field of the summary, never a reason to lose it: whatever the model raises
    (a calibration file changed since the run was validated, a number the formulas refuse)
    becomes `prediction_missing`, beside what was predicted before it."""
    out: dict[str, Any] = {}
    try:
        _predict(out, spec, cfg, summary, steps, updates, extra)
    except Exception as exc:  # noqa: BLE001 -- recorded in the summary, never raised past it
        out["prediction_missing"] = f"the cost model failed: {type(exc).__name__}: {exc}"
    return out


def _predict(out: dict[str, Any], spec: StrategySpec, cfg: RunConfig, summary: dict[str, Any], steps: Any,
             updates: Any, extra: dict[str, Any]) -> dict[str, Any]:
    """predictions' work, filling OUT as it goes (so a failure keeps what came before it)."""
    if not len(steps) or summary.get("step_time_mean_s") is None:
        out["prediction_missing"] = "no model update was recorded"
        return out
    out["comm_s_per_step"] = (critical_comm_s(steps, updates) if spec.synchronous(cfg)
                              else float(steps["comm_s"].mean()))
    if "grad_bytes_logical" not in extra:
        out["prediction_missing"] = "the strategy did not report its gradient size"
        return out
    out["predicted_bytes_sent_per_worker_per_step"] = spec.bytes_per_worker(cfg, extra)
    link = _network_link(spec, cfg, extra.get("actor_nodes") or 1)
    if isinstance(link, str):
        out["prediction_missing"] = link
        return out
    (latency, bandwidth), out["prediction_source"] = link
    try:
        pred = spec.predict(cfg, extra, latency, bandwidth)
    except NotModelled as exc:
        out["prediction_missing"] = str(exc)
        return out
    if not cfg.workload.real_compute:
        compute, source = cfg.workload.compute_ms / 1000.0, "--compute-ms"
    else:  # a real model's compute is what it measured: the model explains communication
        compute, source = float(slowest_compute(steps).median()), "measured"
    if cfg.network.emulated:
        # what the emulator could not hide: messages that arrived after their emulated delivery
        late = (float(steps["late_s"].sum()) + float(extra.get("endpoint_late_s", 0.0))) / max(1, len(updates))
        out.update({"emulation_late_s_per_update": late,
                    "emulation_leak_frac": late / pred.comm_s if pred.comm_s > 0 else None})
        out["emulation_fidelity"] = out["comm_s_per_step"] / pred.comm_s if pred.comm_s > 0 else None
        out["fidelity_warning"] = (advice(out["comm_s_per_step"], pred.comm_s, cfg.network.dilation,
                                          not cfg.workload.real_compute, out["emulation_leak_frac"]) if len(updates) >= 3 else None)
    else:
        out["calibrated_fit"] = out["comm_s_per_step"] / pred.comm_s if pred.comm_s > 0 else None
    out.update({"predicted_comm_s": pred.comm_s, "predicted_step_s": compute + pred.comm_s,
                "predicted_compute_s": compute, "predicted_compute_source": source,
                "formula": pred.formula,
                "predicted_comm_s_no_overlap": pred.comm_s if pred.comm_s_no_overlap is None
                else pred.comm_s_no_overlap})
    out["predicted_overlap_saved_s"] = out["predicted_comm_s_no_overlap"] - pred.comm_s
    return out
