"""Execute one validated RunConfig: folder, cluster, strategy, records, summary.

Shared by `testbed.run` and `testbed.sweep` so that a sweep point runs exactly the code path
of a single run. Every record goes to the run folder's records.jsonl the moment it arrives;
whatever happens (success, Ctrl-C, a failure), summary.json then says how the run ended. All
that is strategy-specific comes from the strategy's spec (`testbed.registry`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from testbed.analysis.results import RunFolder, chrome_trace, new_run_id, table_frame
from testbed.config import ConfigError, RunConfig
from testbed.emulation.faults import RestartsExhausted, ServerLost
from testbed.records import STEP_COLUMNS, UPDATE_COLUMNS, Recorder
from testbed.strategy import NotModelled, StrategySpec


@dataclass
class Outcome:
    exit_code: int
    folder: Path | None
    summary: dict[str, Any] | None
    error_line: str | None = None


def _progress(cfg: RunConfig):
    if cfg.quiet:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.steps, desc=f"{cfg.strategy} N={cfg.workers}", unit="upd",
                leave=False, dynamic_ncols=True)


def execute(cfg: RunConfig, *, run_id: str | None = None) -> Outcome:
    from testbed import registry
    from testbed.runtime.cluster import Cluster

    spec = registry.SPECS[cfg.strategy]
    cluster = Cluster(cfg.cluster, workers=cfg.workers, servers=spec.servers(cfg),
                      torch_workers=cfg.workload.name != "synthetic")
    try:
        cluster.precheck_local()
    except ConfigError as exc:
        return Outcome(2, None, None, str(exc))
    run_id = run_id or new_run_id(cfg.strategy, cfg.workers)
    try:
        folder = RunFolder.create(cfg.out, run_id)
    except OSError as exc:
        return Outcome(2, None, None, f"--out {cfg.out!r}: cannot create the run folder ({exc}); pick another --out")
    folder.write_config(cfg.to_dict())
    bar = _progress(cfg)
    log = folder.record_log()
    recorder = Recorder(sink=log, on_update=(lambda _u: bar.update(1)) if bar else None)
    status, code, error, params, extra = "completed", 0, None, None, {}
    t_start = time.time()
    previous = signal.getsignal(signal.SIGTERM)
    main_thread = threading.current_thread() is threading.main_thread()
    try:
        with cluster:
            if main_thread:  # after ray.init, which installs a SIGTERM handler of its own
                signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
            with spec.create(cfg, cluster, run_id=run_id, workdir=str(folder.path)) as strategy:
                strategy.run(recorder)
                params = strategy.parameters()
                extra = strategy.summary_extra()
    except ConfigError as exc:
        status, code, error = "failed", 2, str(exc)
    except KeyboardInterrupt:
        if main_thread:
            signal.signal(signal.SIGINT, _exit_now)  # a second Ctrl-C leaves at once
        status, code, error = "interrupted", 130, "interrupted; measurements so far are saved"
    except (RestartsExhausted, ServerLost) as exc:
        status, code, error = "failed", 3, str(exc)
    except Exception as exc:  # noqa: BLE001 - the run fails, the records stay
        status, code = "failed", 1
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        (folder.path / "error.txt").write_text(traceback.format_exc())
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        if bar is not None:
            bar.close()
    try:
        summary = finish(folder, spec, cfg, recorder, status, params, {**recorder.extra, **extra}, t_start)
    finally:
        log.close()
        if main_thread:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    return Outcome(code, folder.path, summary, error)


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _exit_now(signum: int, frame: Any) -> None:
    os._exit(130)


def finish(folder: RunFolder, spec: StrategySpec, cfg: RunConfig, recorder: Recorder, status: str,
           params: Any, extra: dict[str, Any], t_start: float) -> dict[str, Any]:
    """Write the record tables, then derive and write the summary (and params, timeline)."""
    folder.write_records(recorder)
    steps = table_frame(recorder.steps, STEP_COLUMNS)
    updates = table_frame(recorder.updates, UPDATE_COLUMNS)
    summary = summarize_run(spec, cfg, steps, updates, extra, status)
    summary["run_id"] = folder.path.name
    summary["elapsed_s"] = time.time() - t_start
    # Ray start-up, actor processes, imports, placement: until the first worker iteration
    summary["startup_s"] = float(steps["t_start"].min()) - t_start if len(steps) else None
    folder.write_summary(summary)
    if params is not None:
        folder.write_params(params)
    if cfg.timeline and recorder.events:
        t0 = min(e["t0"] for e in recorder.events)
        folder.write_timeline(chrome_trace(recorder.events, t0))
    return summary


def summarize_run(spec: StrategySpec, cfg: RunConfig, steps: Any, updates: Any, extra: dict[str, Any],
                  status: str) -> dict[str, Any]:
    """The summary of one run from its records: statistics, the model beside them, extras."""
    from testbed.analysis.metrics import summarize

    summary = summarize(steps, updates, strategy=cfg.strategy, workers=cfg.workers, status=status)
    summary["workload"] = cfg.workload.name
    summary.update(predictions(spec, cfg, summary, steps, updates, extra))
    summary.update(extra)
    return summary


def critical_comm_s(steps: Any, updates: Any) -> float:
    """Median step interval minus the median of each step's slowest compute (sync strategies).

    What is not the slowest worker's compute is communication (and coordination) on the
    critical path. Medians keep the first, warm-up step from dominating short runs. It can
    come out negative (compute that overlapped communication); it is not clamped.
    """
    t = np.sort(updates["t_applied"].to_numpy(dtype=float))
    intervals = np.diff(np.concatenate([[float(steps["t_start"].min())], t]))
    return float(np.median(intervals)) - float(slowest_compute(steps).median())


def slowest_compute(steps: Any) -> Any:
    """Per iteration, the slowest worker's compute plus injected delay."""
    return (steps["compute_s"] + steps["injected_delay_s"]).groupby(steps["iteration"]).max()


def predictions(spec: StrategySpec, cfg: RunConfig, summary: dict[str, Any], steps: Any, updates: Any,
                extra: dict[str, Any]) -> dict[str, Any]:
    """The cost model beside the measurement: bytes always; time whenever the network's alpha and
    beta are known (emulated). Where there is no prediction, `prediction_missing` says why."""
    out: dict[str, Any] = {}
    if not len(steps) or summary.get("step_time_mean_s") is None:
        out["prediction_missing"] = "no model update was recorded"
        return out
    out["comm_s_per_step"] = (critical_comm_s(steps, updates) if spec.synchronous(cfg)
                              else float(steps["comm_s"].mean()))
    if "grad_bytes_logical" not in extra:
        out["prediction_missing"] = "the strategy did not report its gradient size"
        return out
    out["predicted_bytes_sent_per_worker_per_step"] = spec.bytes_per_worker(cfg, extra)
    if not cfg.network.emulated:
        out["prediction_missing"] = ("real network: its latency and bandwidth are unknown; emulate one "
                                     "(--bandwidth, --latency) for the cost model's time")
        return out
    try:
        pred = spec.predict(cfg, extra, cfg.network.latency_s, cfg.network.bandwidth_Bps)
    except NotModelled as exc:
        out["prediction_missing"] = str(exc)
        return out
    if cfg.workload.name == "synthetic":
        compute, source = cfg.workload.compute_ms / 1000.0, "--compute-ms"
    else:  # a real model's compute is what it measured: the model explains communication
        compute, source = float(slowest_compute(steps).median()), "measured"
    # what the emulator could not hide: messages that arrived after their emulated delivery
    late = (float(steps["late_s"].sum()) + float(extra.get("endpoint_late_s", 0.0))) / max(1, len(updates))
    out.update({"emulation_late_s_per_update": late,
                "emulation_leak_frac": late / pred.comm_s if pred.comm_s > 0 else None})
    out.update({"predicted_comm_s": pred.comm_s, "predicted_step_s": compute + pred.comm_s,
                "predicted_compute_s": compute, "predicted_compute_source": source,
                "formula": pred.formula,
                "predicted_comm_s_no_overlap": pred.comm_s if pred.comm_s_no_overlap is None
                else pred.comm_s_no_overlap})
    return out
