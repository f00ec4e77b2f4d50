"""The raw record types every strategy emits, and the recorder that takes them as they happen.

Raw records first, statistics later (`testbed.analysis.metrics` derives the summary):

    StepRecord     one worker iteration: versions, start, compute / comm / wait seconds, bytes,
                   samples, loss, staleness, injected delay
    UpdateRecord   one model update: version, time, contributors, dropped, loss
    Event          one span on an actor's timeline (compute / send / recv / reduce / apply / wait)
    EvalRecord     one held-out evaluation of the authoritative model at a version

A gradient that was never applied has `version_applied` and `staleness` None (null in the
tables), so means over the column are means over applied gradients. Pure: no Ray, no torch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from testbed.emulation.dilation import Dilation
from testbed.emulation.faults import Diverged


@dataclass
class StepRecord:
    """One worker iteration: what it computed, and where its time went."""

    run_id: str
    strategy: str
    worker: int
    iteration: int
    version_read: int  # version of the parameters the gradient was computed from
    version_applied: int | None  # version it was applied at (None: dropped or never applied)
    t_start: float  # wall clock (time.time) when the iteration started
    compute_s: float
    comm_s: float
    wait_s: float
    bytes_sent: int  # logical bytes
    bytes_recv: int
    samples: int
    loss: float
    staleness: int | None  # version_applied - version_read; None when never applied
    injected_delay_s: float
    late_s: float = 0.0  # emulated network: how late this worker's messages arrived (real overhead)
    peers_lag_s: float = 0.0  # emulated peers: how much later than this worker the slowest had its gradient
    node: str | None = None  # the Ray node the worker ran on (`Recorder.locate` fills it in)
    emulated: bool = False  # an emulated peer's iteration, played at the model's times (testbed.ps.async_peers)


@dataclass
class UpdateRecord:
    """One application of gradients to the authoritative parameters."""

    version: int  # version after the update (1 for the first update)
    t_applied: float
    contributors: int
    dropped: int
    loss: float


@dataclass
class Event:
    """A span on one actor's timeline (phase: compute/send/recv/reduce/apply/wait/fault)."""

    actor: str
    phase: str
    t0: float
    t1: float


@dataclass
class EvalRecord:
    """The authoritative model at one version, scored on the held-out split (off the critical path)."""

    version: int  # the parameter version evaluated (0: the initial parameters)
    eval_loss: float
    eval_acc: float | None  # top-1 accuracy (per token for a language model); None where there is none
    eval_ms: float  # how long the evaluation took, real milliseconds (its own process; never a step's)
    t_done: float  # wall clock when it finished


STEP_COLUMNS = tuple(f.name for f in fields(StepRecord))
UPDATE_COLUMNS = tuple(f.name for f in fields(UpdateRecord))
EVENT_COLUMNS = tuple(f.name for f in fields(Event))
EVAL_COLUMNS = tuple(f.name for f in fields(EvalRecord))

# What a worker reports about one iteration (the strategy adds versions and wait).
REPORT_KEYS = ("t_start", "compute_s", "comm_s", "bytes_sent", "bytes_recv", "samples", "loss",
               "injected_delay_s")


def step_record(run_id: str, strategy: str, worker: int, iteration: int, report: Mapping[str, Any], *,
                version_read: int, version_applied: int | None, wait_s: float) -> StepRecord:
    """The one way to build a StepRecord from a worker's report of an iteration."""
    missing = [k for k in REPORT_KEYS if k not in report]
    if missing:
        raise KeyError(f"worker {worker} iteration {iteration}: report lacks {missing}")
    return StepRecord(
        run_id=run_id, strategy=strategy, worker=worker, iteration=iteration,
        version_read=version_read, version_applied=version_applied, t_start=report["t_start"],
        compute_s=report["compute_s"], comm_s=report["comm_s"], wait_s=wait_s,
        bytes_sent=int(report["bytes_sent"]), bytes_recv=int(report["bytes_recv"]),
        samples=int(report["samples"]), loss=float(report["loss"]),
        staleness=None if version_applied is None else version_applied - version_read,
        injected_delay_s=report["injected_delay_s"], late_s=float(report.get("late_s", 0.0)),
        peers_lag_s=float(report.get("peers_lag_s", 0.0)), emulated=bool(report.get("emulated", False)))


class Recorder:
    """Collects raw records and hands each one to a sink the moment it arrives.

    Thread-safe. `sink(kind, row)` persists one record ("step", "update", "event", "fault",
    "rollback"), so a run that dies keeps everything recorded before; `on_update` is called after
    each update (progress bars). `extra` holds what strategies add to the summary. Past
    `max_skipped` non-finite gradients (nan-skipped faults) `fault` raises `Diverged`.
    With `dilation` set (`--dilation`), every time is taken into the emulated cluster's clock
    as it arrives (`testbed.emulation.dilation`): what is stored is what is reported.
    """

    def __init__(self, sink: Callable[[str, dict[str, Any]], None] | None = None,
                 on_update: Callable[[UpdateRecord], None] | None = None,
                 max_skipped: int | None = None) -> None:
        self.steps: list[dict[str, Any]] = []
        self.updates: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}  # strategy-specific summary additions
        self._sink = sink
        self._on_update = on_update
        self._lock = threading.RLock()
        self.max_skipped = max_skipped
        self.skipped = 0  # non-finite gradients left out (nan-skipped faults)
        self.evals: list[dict[str, Any]] = []
        self.dilation: Dilation | None = None
        self.first_update_at: float | None = None  # wall clock of the first update (start-up figures)
        self._eval_every, self._eval_last = 0, -1
        self._evaluate: Callable[[int, Any], None] | None = None
        self._locate: Callable[[], Mapping[int, str]] | None = None
        self._nodes: Mapping[int, str] | None = None  # worker -> node, asked again after a fault

    def locate(self, where: Callable[[], Mapping[int, str]], known: Mapping[int, str] | None = None) -> None:
        """Fill each step's `node` from `where()` (worker -> Ray node, the run's placement); it is
        asked once (not at all while `known` holds the answer), and again after every fault (a
        restarted worker may land elsewhere)."""
        self._locate, self._nodes = where, known

    def _node_of(self, worker: int) -> str | None:
        if self._locate is None:
            return None
        if self._nodes is None:  # once, and again after a fault: never per step
            try:
                self._nodes = self._locate()
            except Exception:  # noqa: BLE001 - a node that cannot be told is null, the step is kept
                self._nodes = {}
        return self._nodes.get(worker)

    # ---- evaluation of the authoritative model (testbed.session.evaluation does the work)
    def plan_evaluation(self, every: int, last: int, evaluate: Callable[[int, Any], None]) -> None:
        """Evaluate versions 0, every, 2 every, ... and `last` (the run's final update) by calling
        `evaluate(version, params)`; every = 0: none."""
        self._eval_every, self._eval_last, self._evaluate = every, last, evaluate

    def wants_eval(self, version: int) -> bool:
        """True when the strategy should hand over the parameters of `version` (`evaluate`)."""
        if self._evaluate is None or self._eval_every <= 0:
            return False
        return version % self._eval_every == 0 or version == self._eval_last

    def evaluate(self, version: int, params: Any) -> None:
        """The authoritative parameters after `version`: a flat array the caller will not change
        again, or a callable that returns one (called off the strategy's thread)."""
        if self.wants_eval(version):
            assert self._evaluate is not None
            self._evaluate(version, params)

    def evaluation(self, rec: EvalRecord) -> None:
        row = self._time(asdict(rec))  # t_done moves with --dilation; eval_ms is real compute and stays
        with self._lock:
            self.evals.append(row)
            self._emit("eval", row)

    def dilate(self, factor: float, origin: float) -> None:
        """From now on take times into the clock of a cluster run `factor` times slower since
        `origin` (`--dilation`; 1 leaves them as they are)."""
        self.dilation = Dilation(factor, origin) if factor != 1.0 else None

    def summary_extras(self, strategy_extra: dict[str, Any]) -> dict[str, Any]:
        """What the summary adds from the run: this recorder's extras (faults, already in the
        run's clock) and the strategy's, taken into it."""
        extra = strategy_extra if self.dilation is None else self.dilation.extras(strategy_extra)
        return {**self.extra, **extra}

    def _time(self, row: dict[str, Any]) -> dict[str, Any]:
        return row if self.dilation is None else self.dilation.row(row)

    def _emit(self, kind: str, row: dict[str, Any]) -> None:
        if self._sink is not None:
            self._sink(kind, row)

    def step(self, rec: StepRecord) -> None:
        row = self._time(asdict(rec))
        if row["node"] is None:
            row["node"] = self._node_of(rec.worker)
        with self._lock:
            self.steps.append(row)
            self._emit("step", row)

    def update(self, rec: UpdateRecord) -> None:
        row = self._time(asdict(rec))
        with self._lock:
            if self.first_update_at is None:
                self.first_update_at = time.time()
            self.updates.append(row)
            self._emit("update", row)
        if self._on_update is not None:
            self._on_update(rec)

    def event(self, actor: str, phase: str, t0: float, t1: float) -> None:
        self.events_from([(actor, phase, t0, t1)])

    def events_from(self, rows: Iterable[tuple[str, str, float, float]]) -> None:
        with self._lock:
            for a, p, t0, t1 in rows:
                row = self._time({"actor": a, "phase": p, "t0": t0, "t1": t1})
                self.events.append(row)
                self._emit("event", row)

    def fault(self, kind: str, actor: str, iteration: int, t0: float, t1: float, **detail: Any) -> None:
        """Record a fault and its recovery (kept in the summary's `faults` list and the timeline)."""
        row = self._time({"kind": kind, "actor": actor, "iteration": iteration, "t0": t0,
                          "time_lost_s": t1 - t0, **detail})
        with self._lock:
            self.extra.setdefault("faults", []).append(row)
            self._emit("fault", row)
            self._nodes = None  # where the workers are is asked again
            if kind == "nan-skipped":
                self.skipped += 1
        self.event(actor, "fault", t0, t1)  # (taken into the emulated clock there)
        if self.max_skipped is not None and self.skipped > self.max_skipped:
            raise Diverged(f"{self.skipped} non-finite gradients were skipped (--max-skipped "
                           f"{self.max_skipped}): the model diverged; lower --lr or raise --max-skipped")

    def rollback(self, version: int) -> None:
        """Updates after `version` were undone (a PS rollback): keep them aside, not in the table."""
        with self._lock:
            undone = [u for u in self.updates if u["version"] > version]
            self.updates = [u for u in self.updates if u["version"] <= version]
            self.evals = [e for e in self.evals if e["version"] <= version]  # redone versions are evaluated again
            self.extra.setdefault("rolled_back_updates", []).extend(undone)
            self._emit("rollback", {"version": version})
