"""Execute one validated RunConfig: folder, cluster, strategy, records, summary.

Shared by `testbed.run` and `testbed.sweep` so that a sweep point runs exactly the code path
of a single run. Whatever happens (success, Ctrl-C, a failure), what was measured is flushed
and summary.json says how the run ended.
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

from testbed.analysis.results import RunFolder, chrome_trace, new_run_id
from testbed.config import ConfigError, RunConfig
from testbed.emulation.faults import RestartsExhausted, ServerLost


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
    from testbed.strategy import Recorder

    cls = registry.STRATEGIES[cfg.strategy]
    cluster = Cluster(cfg.cluster, workers=cfg.workers, servers=servers_for(cfg),
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
    recorder = Recorder(sink=folder.write_records, on_update=(lambda _u: bar.update(1)) if bar else None)
    status, code, error, params, extra = "completed", 0, None, None, {}
    t_start = time.time()
    previous = signal.getsignal(signal.SIGTERM)
    main_thread = threading.current_thread() is threading.main_thread()
    try:
        with cluster:
            if main_thread:  # after ray.init, which installs a SIGTERM handler of its own
                signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
            with cls(cfg, cluster, run_id=run_id, workdir=str(folder.path)) as strategy:
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
        summary = finish(folder, cfg, recorder, status, params, {**recorder.extra, **extra}, t_start)
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    return Outcome(code, folder.path, summary, error)


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _exit_now(signum: int, frame: Any) -> None:
    os._exit(130)


def servers_for(cfg: RunConfig) -> int:
    """Actors besides the workers that the strategy places (PS shards)."""
    return cfg.ps.shards if cfg.strategy.startswith("ps-") else 0


def finish(folder: RunFolder, cfg: RunConfig, recorder: Any, status: str, params: Any,
           extra: dict[str, Any], t_start: float) -> dict[str, Any]:
    """Flush raw records, then derive and write the summary (and params, timeline)."""
    import pandas as pd

    from testbed.analysis.metrics import summarize
    from testbed.strategy import STEP_COLUMNS, UPDATE_COLUMNS

    folder.write_records(recorder)
    steps = pd.DataFrame(recorder.steps, columns=list(STEP_COLUMNS))
    updates = pd.DataFrame(recorder.updates, columns=list(UPDATE_COLUMNS))
    summary = summarize(steps, updates, strategy=cfg.strategy, workers=cfg.workers, status=status)
    summary["run_id"] = folder.path.name
    summary["elapsed_s"] = time.time() - t_start
    # Ray start-up, actor processes, imports, placement: until the first worker iteration
    summary["startup_s"] = float(steps["t_start"].min()) - t_start if len(steps) else None
    summary["workload"] = cfg.workload.name
    summary.update(_predictions(cfg, summary, steps, updates, extra))
    summary.update(extra)
    folder.write_summary(summary)
    if params is not None:
        folder.write_params(params)
    if cfg.timeline and recorder.events:
        t0 = min(e["t0"] for e in recorder.events)
        folder.write_timeline(chrome_trace(recorder.events, t0))
    return summary


def critical_comm_s(steps: Any, updates: Any) -> float:
    """Median step interval minus the median of each step's slowest compute (sync strategies).

    What is not the slowest worker's compute is communication (and coordination) on the
    critical path. Medians keep the first, warm-up step from dominating short runs.
    """
    t = np.sort(updates["t_applied"].to_numpy(dtype=float))
    intervals = np.diff(np.concatenate([[float(steps["t_start"].min())], t]))
    slowest = (steps["compute_s"] + steps["injected_delay_s"]).groupby(steps["iteration"]).max()
    return max(0.0, float(np.median(intervals)) - float(slowest.median()))


def _predictions(cfg: RunConfig, summary: dict[str, Any], steps: Any, updates: Any,
                 extra: dict[str, Any]) -> dict[str, Any]:
    """Cost-model prediction beside the measurement whenever the network is emulated."""
    out: dict[str, Any] = {}
    if len(steps) and summary.get("step_time_mean_s") is not None:
        from testbed import registry

        if registry.STRATEGIES[cfg.strategy].synchronous and not cfg.gossip.asynchronous:
            out["comm_s_per_step"] = critical_comm_s(steps, updates)
        else:
            out["comm_s_per_step"] = float(steps["comm_s"].mean())
    if not cfg.network.emulated:
        return out
    from testbed.analysis import costmodel

    grad_bytes = extra.get("grad_bytes_logical")
    if grad_bytes is None:
        return out
    try:  # config fixes the model; the strategy reports what it resolved (buckets, nodes, degree)
        pred = costmodel.predict(
            cfg.strategy, workers=cfg.workers, grad_bytes=grad_bytes, latency=cfg.network.latency_s,
            bandwidth=cfg.network.bandwidth_Bps, shards=cfg.ps.shards,
            buckets=extra.get("buckets", 1), compute_s=cfg.workload.compute_ms / 1000.0,
            algorithm=cfg.ring.algorithm, node_size=extra.get("node_size"), nodes=extra.get("nodes"),
            degree=extra.get("degree", 2), asynchronous=cfg.gossip.asynchronous,
            compression=cfg.compression)
    except ValueError:
        return out
    out.update(pred)
    return out
