"""Held-out evaluation of the authoritative model, off the workers' critical path.

Every strategy hands the recorder the authoritative parameters of versions 0, K, 2K, ... and the
last (`Recorder.evaluate`; K = --eval-every): the parameter server's versions (its servers keep a
copy of each such version), the MapReduce driver's, ring rank 0's (its report carries them), the
average of the gossip replicas. This module scores them:

    strategy thread               evaluator thread (driver)          evaluator process (nice 19)
    recorder.evaluate(v, p) --->  queue; p() when p is a fetch --->   workload.evaluate(p)
                                  EvalRecord -> recorder    <-------  {loss, acc}

Why a process of its own, at the lowest CPU priority: the time-to-accuracy figures are only
honest if evaluating does not slow training. On a machine whose cores the workers fill, a
thread of the driver would take its share of the CPU; a nice-19 process gets what the workers
leave (on Linux about 1.5% of a contended core) and catches up when training ends, and it holds
no lock the driver needs. So evaluations can lag behind training; the run waits for them at the
end (at most --timeout). Each record says how long its evaluation took (`eval_ms`), and the time
it is placed at is the time its version was applied, never the time it was scored.
A synthetic workload's evaluation is one vector pass; it runs on the evaluator thread.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from testbed.analysis.records import EvalRecord, Recorder
from testbed.config import RunConfig, from_dict

NICE = 19


def _serve(conn: Any, config: dict[str, Any]) -> None:
    """The evaluator process: build the workload, score each parameter vector it is sent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the driver decides
    cfg = from_dict(config)
    evaluate = _scorer(cfg)
    while True:
        try:
            flat = conn.recv()
        except (EOFError, OSError):  # the driver is gone
            return
        try:
            conn.send(("ok", evaluate(flat)))
        except Exception as exc:  # noqa: BLE001 - reported on the driver, one line
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _scorer(cfg: RunConfig) -> Callable[[Any], dict[str, Any]]:
    from testbed.runtime.worker import limit_threads
    from testbed.workloads import make_workload

    if cfg.workload.imports_torch("cpu"):
        limit_threads(1)
    model = make_workload(replace(cfg.workload, compute_ms=0.0), seed=cfg.seed, workers=cfg.workers)

    def score(flat: Any) -> dict[str, Any]:
        # A diverged model (--lr 1e6) overflows here; the loss it yields is recorded as it is
        # (NaN or inf: eval_loss) and divergence is --on-nan's to judge, so numpy's
        # floating-point warnings would only be stray lines on the run's stderr.
        import numpy as np

        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            return {**model.evaluate(flat, cfg.eval.samples), "optimum": model.optimum}
    return score


class Evaluator:
    """Scores the versions a recorder is handed (`attach`), as the module docstring says."""

    def __init__(self, cfg: RunConfig, recorder: Recorder,
                 on_result: Callable[[EvalRecord], None] | None = None) -> None:
        self.cfg, self.recorder, self.on_result = cfg, recorder, on_result
        self.jobs: queue.Queue = queue.Queue()
        self.error: str | None = None
        self.optimum: float | None = None  # the workload's best achievable held-out loss, where known
        self.pending = 0
        self.done, self.longest_s = 0, 0.0  # evaluations scored, and the longest one's wall time
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: Any = None
        self._stopped = False
        self.thread = threading.Thread(target=self._work, name="testbed-eval", daemon=True)

    def attach(self) -> None:
        """Plan the recorder's evaluations and start working (before the strategy runs)."""
        every = self.cfg.eval.interval(self.cfg.steps)
        if every <= 0:
            return
        self.recorder.plan_evaluation(every, self.cfg.steps, self.submit)
        self.thread.start()

    def submit(self, version: int, params: Any) -> None:
        with self._lock:
            self.pending += 1
        self.jobs.put((version, params))

    # ---- the evaluator thread
    def _start_scorer(self) -> Callable[[Any], dict[str, Any]]:
        if not self.cfg.workload.real_compute:
            return _scorer(self.cfg)
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child, self.cfg.to_dict()), name="testbed-eval", daemon=True)
        proc.start()
        try:  # from its first instruction on (the driver may raise a child's niceness)
            os.setpriority(os.PRIO_PROCESS, proc.pid, NICE)
        except OSError:
            pass
        self._proc = proc  # seen from other threads only once it runs at its priority
        child.close()

        def remote(flat: Any) -> dict[str, Any]:
            self._conn.send(flat)
            status, value = self._conn.recv()
            if status != "ok":
                raise RuntimeError(value)
            return value

        return remote

    def _work(self) -> None:
        try:
            score = self._start_scorer()
        except Exception as exc:  # noqa: BLE001 - the run goes on; the summary says why there are no evals
            self.error = f"the evaluator did not start: {type(exc).__name__}: {exc}"
            return
        while (job := self.jobs.get()) is not None:
            version, params = job
            try:
                flat = params() if callable(params) else params
                t0 = time.time()
                result = score(flat)
                t1 = time.time()
                self.optimum = result.get("optimum")
                rec = EvalRecord(version=version, eval_loss=float(result["loss"]),
                                 eval_acc=None if result["acc"] is None else float(result["acc"]),
                                 eval_ms=(t1 - t0) * 1e3, t_done=t1)
                self.recorder.evaluation(rec)
                with self._lock:
                    self.done += 1
                    self.longest_s = max(self.longest_s, t1 - t0)
                if self.on_result is not None:
                    self.on_result(rec)
            except Exception as exc:  # noqa: BLE001 - kept in the summary (`eval_error`), never swallowed
                if self._stopped:
                    return
                self.error = f"evaluating version {version}: {type(exc).__name__}: {str(exc)[:200]}"
                return
            finally:
                with self._lock:
                    self.pending -= 1

    # ---- the end
    def finish(self, timeout: float) -> None:
        """Wait for the evaluations still queued (a completed run) while they progress: until
        none has finished for `timeout` seconds or twice the longest one scored so far, whichever
        is longer (the evaluator runs at nice 19, so a busy machine slows it down; its own pace
        says when it has stopped, not a clock)."""
        if self.thread.is_alive():
            self.jobs.put(None)
            while self.thread.is_alive():
                done = self.done
                window = max(timeout, 2 * self.longest_s)
                self.thread.join(window)
                if self.done == done:
                    break
            if self.thread.is_alive() and self.error is None:
                self.error = (f"{self.pending} evaluations were unfinished: none finished in {window:g} s "
                              "after training ended (--timeout, or twice the longest evaluation); raise "
                              "--eval-every or --timeout")
        self.stop()

    def stop(self) -> None:
        """End the evaluator process now (a failed or interrupted run keeps what was scored)."""
        self._stopped = True
        proc, self._proc = self._proc, None
        if proc is not None:
            if self._conn is not None:
                self._conn.close()
            proc.join(0.5)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
