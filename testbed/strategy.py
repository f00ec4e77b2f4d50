"""The Strategy contract and the raw record types: the only things the harness knows.

A strategy trains until `config.steps` model updates are applied and hands every raw record to
the recorder as it happens. A *model update* is one application of gradients to the
authoritative parameters: one global step for synchronous strategies, one applied gradient for
an asynchronous parameter server.

    with StrategyClass(config, cluster) as strategy:   # setup(): actors + identical replicas
        strategy.run(recorder)                          # records stream out while it trains
        params = strategy.parameters()                  # {name: float32 array}
                                                        # teardown(): kills only its actors
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

import numpy as np

from testbed.config import RunConfig


@dataclass
class StepRecord:
    """One worker iteration: what it computed, and where its time went."""

    run_id: str
    strategy: str
    worker: int
    iteration: int
    version_read: int  # version of the parameters the gradient was computed from
    version_applied: int  # server version when applied (-1: dropped or not applied)
    t_start: float  # wall clock (time.time) when the iteration started
    compute_s: float
    comm_s: float
    wait_s: float
    bytes_sent: int  # logical bytes
    bytes_recv: int
    samples: int
    loss: float
    staleness: int  # version_applied - version_read; 0 for synchronous strategies
    injected_delay_s: float


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
    """A span on one actor's timeline (phase: compute/send/recv/reduce/apply/wait)."""

    actor: str
    phase: str
    t0: float
    t1: float


STEP_COLUMNS = tuple(f.name for f in fields(StepRecord))
UPDATE_COLUMNS = tuple(f.name for f in fields(UpdateRecord))
EVENT_COLUMNS = tuple(f.name for f in fields(Event))


class Recorder:
    """Collects raw records in memory and lets a sink persist them as they arrive.

    Thread-safe. `on_update` is called after each update (progress bars); `sink(recorder)` is
    called at most every `flush_every_s` seconds and by `flush()`.
    """

    def __init__(
        self,
        sink: Callable[[Recorder], None] | None = None,
        on_update: Callable[[UpdateRecord], None] | None = None,
        flush_every_s: float = 2.0,
    ) -> None:
        self.steps: list[dict[str, Any]] = []
        self.updates: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}  # strategy-specific summary additions
        self._sink = sink
        self._on_update = on_update
        self._flush_every_s = flush_every_s
        self._last_flush = time.monotonic()
        self._lock = threading.RLock()

    def step(self, rec: StepRecord) -> None:
        with self._lock:
            self.steps.append(asdict(rec))
        self._maybe_flush()

    def update(self, rec: UpdateRecord) -> None:
        with self._lock:
            self.updates.append(asdict(rec))
        if self._on_update is not None:
            self._on_update(rec)
        self._maybe_flush()

    def event(self, actor: str, phase: str, t0: float, t1: float) -> None:
        with self._lock:
            self.events.append({"actor": actor, "phase": phase, "t0": t0, "t1": t1})

    def events_from(self, rows: list[tuple[str, str, float, float]]) -> None:
        with self._lock:
            self.events.extend({"actor": a, "phase": p, "t0": t0, "t1": t1} for a, p, t0, t1 in rows)

    def fault(self, kind: str, actor: str, iteration: int, t0: float, t1: float, **detail: Any) -> None:
        """Record a fault and its recovery (kept in the summary's `faults` list and the timeline)."""
        with self._lock:
            self.extra.setdefault("faults", []).append(
                {"kind": kind, "actor": actor, "iteration": iteration, "t0": t0, "time_lost_s": t1 - t0,
                 **detail})
        self.event(actor, "fault", t0, t1)

    def rollback(self, version: int) -> None:
        """Updates after `version` were undone (a PS rollback): keep them aside, not in the table."""
        with self._lock:
            undone = [u for u in self.updates if u["version"] > version]
            self.updates = [u for u in self.updates if u["version"] <= version]
            self.extra.setdefault("rolled_back_updates", []).extend(undone)

    def _maybe_flush(self) -> None:
        if self._sink is not None and time.monotonic() - self._last_flush >= self._flush_every_s:
            self.flush()

    def flush(self) -> None:
        if self._sink is None:
            return
        with self._lock:
            self._last_flush = time.monotonic()
            self._sink(self)


class Strategy(ABC):
    """Base class of every synchronisation strategy (one level of inheritance).

    Subclasses set `name` and `family` ("mapreduce", "ps", "allreduce") and implement the four
    methods. `cluster` is a started `testbed.cluster.Cluster`.
    """

    name: ClassVar[str]
    family: ClassVar[str]
    synchronous: ClassVar[bool] = True

    def __init__(self, config: RunConfig, cluster: Any, run_id: str = "run",
                 workdir: str | None = None) -> None:
        self.config = config
        self.cluster = cluster
        self.run_id = run_id
        self.workdir = workdir  # the run folder: checkpoints and other files of this run

    @abstractmethod
    def setup(self) -> None:
        """Create this strategy's actors; make all replicas start from identical parameters."""

    @abstractmethod
    def run(self, recorder: Recorder) -> None:
        """Train until config.steps model updates are applied, streaming records."""

    @abstractmethod
    def parameters(self) -> dict[str, np.ndarray]:
        """Return the final authoritative parameters, keyed by parameter name."""

    @abstractmethod
    def teardown(self) -> None:
        """Kill this strategy's actors (idempotent)."""

    def summary_extra(self) -> dict[str, Any]:
        """Strategy-specific summary additions (derived from records by default: none)."""
        return {}

    def __enter__(self) -> Strategy:
        try:
            self.setup()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()
