"""The Strategy contract: what the harness knows of a strategy, before and during a run.

A strategy is two objects:

* a `StrategySpec` -- everything true of it that is known before Ray starts: its name and
  family, the config keys it reads (every other strategy-specific key is rejected), the
  choices of its own keys, its own validation rules, how many server actors it places, whether
  its model updates are synchronous steps, its summary keys, and its cost-model prediction
  from the config plus what it resolved at setup. Pure: importing a spec imports no Ray.
* a `Strategy` -- its Ray shell, imported only when a run starts (`spec.shell`, `spec.create`):

    with spec.create(config, cluster) as strategy:   # setup(): actors + identical replicas
        strategy.run(recorder)                        # records stream out while it trains
        params = strategy.parameters()                # {name: float32 array}
                                                      # teardown(): kills only its actors

A *model update* is one application of gradients to the authoritative parameters: one global
step for synchronous strategies, one applied gradient for an asynchronous parameter server.
Adding a strategy: one package with a spec and a Strategy subclass, and one registry line
(docs/architecture.md, "Adding a strategy").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from testbed.analysis.records import Recorder, step_record
from testbed.config import RunConfig
from testbed.emulation.peers import real_positions


@dataclass(frozen=True)
class Prediction:
    """The alpha-beta model's communication time per model update, and how it was derived."""

    comm_s: float
    formula: str
    comm_s_no_overlap: float | None = None  # the no-overlap upper bound, where comm_s pipelines


@dataclass(frozen=True)
class Variant:
    """One configuration of a strategy that `python -m testbed.map` ranks: config keys -> values
    on top of the map's base config, the name the map shows, and whether its update is the
    synchronous minibatch step (`exact`: one step averages every worker's gradient of the same
    parameters, so step times compare as they are); stale or averaged-model updates are not, and
    rank only once their samples to a target loss are known. `kind` names the update rule it
    shares with other variants that differ only in where the bytes go (the same samples to a
    target): one measurement stands for all of a kind; by default each variant is its own.
    `per_gradient`: each update applies one worker's gradient to the one shared model (the
    asynchronous PS), which the map measures at lr / N, the synchronous step per sample."""

    overrides: Mapping[str, Any]
    label: str
    exact: bool = True
    kind: str | None = None
    per_gradient: bool = False


@dataclass(frozen=True)
class Equivalence:
    """A run a strategy declares equal, to float tolerance, to training in one process: `workers`
    workers with `overrides` (config keys, e.g. testbed.workloads.tiny's presets) on the small
    synthetic config of the equivalence test (tests/ray/test_equivalence.py), against
    `testbed.workloads.reference.reference_training`, or the spec's own `reference` where it has one."""

    workers: int
    overrides: Mapping[str, Any] = field(default_factory=dict)


class StrategySpec(ABC):
    """What is true of one strategy, known without Ray (see the module docstring)."""

    name: str
    family: str
    sections: Mapping[str, type] = {}  # its own config sections, name -> dataclass (testbed.config.schema)
    keys: frozenset[str] = frozenset()  # strategy-specific config keys it reads
    choices: Mapping[str, tuple[str, ...]] = {}  # the allowed values of some of its keys
    summary_keys: Mapping[str, str] = {}  # its own summary.json keys -> meaning (results/README)
    fault_kinds: tuple[str, ...] = ("kill", "hang", "nan")  # the --fail kinds its workers can fire
    equivalence: tuple[Equivalence, ...] = ()  # its runs that must equal one-process training
    # strategies whose Ray shell this one extends: its package may import theirs, no other
    builds_on: tuple[StrategySpec, ...] = ()

    def reference(self, cfg: RunConfig, device: str = "cpu") -> np.ndarray | None:
        """Its own single-process reference for an `Equivalence` run (flat parameters), or None
        where that is plain SGD on the concatenated batch (testbed.workloads.reference)."""
        return None

    def synchronous(self, cfg: RunConfig) -> bool:
        """True when a model update is one global step that every worker contributes to."""
        return True

    def period(self, cfg: RunConfig) -> int:
        """Iterations per communication round: 1 where the workers communicate every iteration,
        H for local SGD's averages. Above 1 its prediction is a mean over the iterations, and so
        is its measurement; a check (`testbed.map`) runs whole rounds."""
        return 1

    def servers(self, cfg: RunConfig) -> int:
        """Actors besides the workers that it places (parameter-server shards)."""
        return 0

    def colocated_servers(self, cfg: RunConfig) -> bool:
        """True when server i shares worker i's machine (its placement bundle and NIC)."""
        return False

    def cannot_share_processes(self, cfg: RunConfig) -> str | None:
        """Why its workers cannot share a process (--workers-per-process, testbed.runtime.hosting),
        or None where they can: where they talk by actor calls or links it can make in-process."""
        return "its workers are linked process to process"

    def cannot_emulate_peers(self, cfg: RunConfig) -> str | None:
        """Why its runs cannot have emulated peers (--real-workers below --workers,
        testbed.emulation.peers), or None where its package plays them."""
        return "has no emulated peers yet (its workers' messages are all real)"

    def messages_per_step(self, cfg: RunConfig) -> int | None:
        """Actor calls one real worker makes per step, where many and known before the run (a
        parameter server's partitions), or None. `--real-workers auto` starts fewer real workers
        where theirs together pass AUTO_MESSAGES (testbed.config.validate)."""
        return None

    def cannot_share_gpu(self, cfg: RunConfig) -> str | None:
        """Why its workers need a GPU each under --device cuda, with the fix, or None where several
        workers may share one GPU (each holds its replica there and moves bytes through the host)."""
        return None

    def validate(self, cfg: RunConfig) -> None:  # noqa: B027 - most strategies have no rule of their own
        """Its own rules beyond keys and choices; raise ConfigError (testbed.config.fail)."""

    def message_path(self, cfg: RunConfig) -> str:
        """Which measured path of a real network its messages take (testbed.config.calibration):
        an actor call through the object store unless the strategy says otherwise."""
        return "call"

    def map_variants(self, cfg: RunConfig) -> list[Variant]:
        """The configurations of this strategy worth ranking for cfg's workers (testbed.map):
        by default its own defaults alone."""
        return [Variant({}, self.name)]

    def plan(self, cfg: RunConfig, logical_sizes: list[int], backward_share: list[float] | None) -> dict[str, Any]:
        """What a run of cfg resolves at setup that `predict` reads, from the workload's logical
        tensor sizes alone (no Ray; testbed.map predicts from it): the gradient bytes, and what a
        strategy adds of its own (the allreduce's buckets)."""
        return {"grad_bytes_logical": 4 * sum(logical_sizes)}

    @abstractmethod
    def predict(self, cfg: RunConfig, resolved: Mapping[str, Any], latency: float,
                bandwidth: float) -> Prediction:
        """The cost model's communication time per update on links of (latency s, bandwidth B/s);
        `resolved` is what the run resolved at setup (summary extras: gradient bytes, buckets,
        nodes, degree). Raise NotModelled with the reason when there is no formula."""

    @abstractmethod
    def bytes_per_worker(self, cfg: RunConfig, resolved: Mapping[str, Any]) -> float:
        """The logical bytes one worker sends per iteration, by the model (beside the measured)."""

    @abstractmethod
    def shell(self) -> type[Strategy]:
        """Its Ray shell, the Strategy subclass: imported inside this method, so that a spec
        stays pure and Ray comes in only when a run starts."""

    def create(self, config: RunConfig, cluster: Any, run_id: str = "run",
               workdir: str | None = None) -> Strategy:
        """Build its Ray shell for one run."""
        return self.shell()(self, config, cluster, run_id, workdir)


class Strategy(ABC):
    """The Ray shell of a strategy (one level of inheritance). `cluster` is a started
    `testbed.runtime.cluster.Cluster`; `spec` is the StrategySpec that created it."""

    def __init__(self, spec: StrategySpec, config: RunConfig, cluster: Any, run_id: str = "run",
                 workdir: str | None = None) -> None:
        self.spec = spec
        self.config = config
        self.cluster = cluster
        self.run_id = run_id
        self.workdir = workdir  # the run folder: checkpoints and other files of this run
        # the positions of the real workers among the N (--real-workers, testbed.emulation.peers):
        # a strategy knows its actors by index, its records name them by position
        self.positions = real_positions(config.workers, config.real_workers)

    @property
    def name(self) -> str:
        return self.spec.name

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
        """Strategy-specific summary additions (its spec's `summary_keys`)."""
        return {}

    def record(self, recorder: Recorder, worker: int, iteration: int, report: dict[str, Any], *,
               version_read: int, version_applied: int | None, wait_s: float) -> None:
        """One worker iteration from its report: the StepRecord, and the spans it brought."""
        recorder.events_from(report.pop("events", ()))
        recorder.step(step_record(self.run_id, self.name, worker, iteration, report,
                                  version_read=version_read, version_applied=version_applied,
                                  wait_s=wait_s))

    def __enter__(self) -> Strategy:
        try:
            self.setup()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()
