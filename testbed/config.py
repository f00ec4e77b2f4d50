"""One validated configuration for a run: frozen dataclasses, every rule, no Ray import.

`RunConfig` is built from the command line (`testbed.run`) or a sweep point (`testbed.sweep`)
through `build_config(values, strategies)`, validated there, and saved as `config.json` beside
the run's measurements. A rule that fails raises `ConfigError` whose text is the one line the
user sees: the flag, the value and the fix.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from testbed import units
from testbed.allreduce.algorithms import ALGORITHMS
from testbed.compression import parse_compression
from testbed.emulation.faults import parse_faults, validate_faults
from testbed.emulation.stragglers import parse_stragglers, validate_stragglers
from testbed.gossip.topology import TOPOLOGIES

WORKLOADS = ("mlp", "logreg", "synthetic")
DEVICES = ("auto", "cpu", "cuda")
PLACEMENTS = ("pack", "spread")
TRANSPORTS = ("object-store", "torch")
MAX_WORKERS = 4096  # far past what one Ray cluster here can place; resources are checked later


class ConfigError(ValueError):
    """A user input is wrong; the message is one line naming the value and the fix."""

    def __init__(self, message: str) -> None:
        # user text can carry line breaks; the message stays one line whatever they typed
        super().__init__(str(message).replace("\r", "\\r").replace("\n", "\\n"))


@dataclass(frozen=True)
class WorkloadConfig:
    name: str = "mlp"
    batch_size: int = 32  # per worker
    lr: float = 0.1
    grad_mb: float = 4.0  # synthetic: logical gradient size in MiB
    compute_ms: float = 10.0  # synthetic: compute time per iteration
    backward_frac: float = 2 / 3  # synthetic: share of compute_ms that is backward
    payload: str = "full"  # synthetic: "full" or "scaled:F"
    samples: int = 8192  # real workloads: size of the generated data set
    features: int = 32
    classes: int = 4
    hidden: int = 64

    @property
    def payload_scale(self) -> float:
        return 1.0 if self.payload == "full" else float(self.payload.split(":", 1)[1])


@dataclass(frozen=True)
class ClusterConfig:
    address: str | None = None  # None: embedded local Ray
    placement: str = "pack"
    device: str = "auto"
    cpus_per_worker: float | None = None  # None: share the cluster's CPUs evenly (<= 1 each)
    timeout_s: float = 120.0  # every wait on a remote call


@dataclass(frozen=True)
class PSConfig:
    shards: int = 1
    staleness_bound: int | None = None  # None: fully asynchronous (ps-async only)
    backup_workers: int = 0  # ps-sync only


@dataclass(frozen=True)
class RingConfig:
    bucket_mb: float = 25.0
    overlap: bool = True
    transport: str = "object-store"
    algorithm: str = "ring"  # ring | halving-doubling | tree | hierarchical
    node_size: int | None = None  # hierarchical: workers per emulated node (None: Ray nodes)


@dataclass(frozen=True)
class GossipConfig:
    topology: str = "ring"  # ring | torus | exponential | complete
    asynchronous: bool = False  # pairwise averaging with one random neighbour, no rounds


@dataclass(frozen=True)
class NetworkConfig:
    bandwidth: str | None = None  # None: real mode, no emulation
    latency: str = "0us"

    @property
    def emulated(self) -> bool:
        return self.bandwidth is not None

    @property
    def bandwidth_Bps(self) -> float | None:
        return None if self.bandwidth is None else units.parse_bandwidth(self.bandwidth, flag="--bandwidth")

    @property
    def latency_s(self) -> float:
        return units.parse_duration(self.latency, flag="--latency")


@dataclass(frozen=True)
class FaultConfig:
    fail: str = "none"  # --fail SPEC (testbed.emulation.faults)
    max_restarts: int = 3  # per actor
    checkpoint_every: int = 0  # PS shards: versions between checkpoints (0: none)
    on_nan: str = "skip"  # skip | stop


@dataclass(frozen=True)
class RunConfig:
    strategy: str = "ring"
    workers: int = 4
    steps: int = 100  # model updates
    seed: int = 0
    out: str = "results/runs"
    quiet: bool = False
    timeline: bool = False
    straggler: str = "none"
    compression: str = "none"  # none | fp16 | topk:F (testbed.compression)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    ps: PSConfig = field(default_factory=PSConfig)
    ring: RingConfig = field(default_factory=RingConfig)
    gossip: GossipConfig = field(default_factory=GossipConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def grad_bytes_logical(self) -> int | None:
        """Logical gradient bytes of the synthetic workload (None for real models)."""
        if self.workload.name != "synthetic":
            return None
        return int(self.workload.grad_mb * 2**20)


def from_dict(data: Mapping[str, Any]) -> RunConfig:
    """Rebuild a RunConfig from `to_dict()` output (e.g. a saved config.json)."""
    parts = {
        "workload": WorkloadConfig,
        "cluster": ClusterConfig,
        "ps": PSConfig,
        "ring": RingConfig,
        "gossip": GossipConfig,
        "network": NetworkConfig,
        "faults": FaultConfig,
    }
    names = {f.name for f in fields(RunConfig)}
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            continue
        kwargs[key] = parts[key](**value) if key in parts else value
    return RunConfig(**kwargs)


# ---------------------------------------------------------------- validation


def _fail(flag: str, value: Any, fix: str) -> None:
    raise ConfigError(f"{flag} {value!r}: {fix}")


def _finite(flag: str, value: float, *, low: float, low_ok: bool, fix: str) -> None:
    bad = not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value)
    bad = bad or math.isinf(value) or (value < low if low_ok else value <= low)
    if bad:
        _fail(flag, value, fix)


def _int_range(flag: str, value: Any, low: int, high: int | None, fix: str) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        _fail(flag, value, fix)


def validate(cfg: RunConfig, strategies: Mapping[str, str]) -> RunConfig:
    """Check every rule; return cfg unchanged or raise ConfigError.

    `strategies` maps each registered strategy name to its family ("ps", "allreduce",
    "mapreduce", ...) so that family-specific flags can be checked without importing Ray.
    """
    if cfg.strategy not in strategies:
        _fail("--strategy", cfg.strategy, f"choose one of {', '.join(sorted(strategies))}")
    family = strategies[cfg.strategy]
    _int_range("--workers", cfg.workers, 1, MAX_WORKERS, f"use an integer in 1..{MAX_WORKERS}")
    _int_range("--steps", cfg.steps, 1, 10_000_000, "use a positive integer number of updates")
    _int_range("--seed", cfg.seed, 0, 2**32 - 1, "use an integer in 0..2**32-1")
    _validate_workload(cfg.workload)
    _validate_cluster(cfg.cluster)
    _validate_ps(cfg, family)
    _validate_ring(cfg, family)
    _validate_gossip(cfg, family)
    _validate_compression(cfg, family)
    _validate_network(cfg.network)
    if cfg.network.emulated and cfg.strategy == "allreduce-torch":
        _fail("--bandwidth", cfg.network.bandwidth, "the library allreduce moves bytes itself and cannot be "
              "emulated; drop --bandwidth or use --strategy ring")
    try:
        specs = parse_stragglers(cfg.straggler)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for spec in specs:  # name the text the user typed, not the spec's normalised form
        worker = getattr(spec, "worker", None)
        if worker is not None and worker >= cfg.workers:
            _fail("--straggler", cfg.straggler,
                  f"there is no worker {worker}; use a worker in 0..{cfg.workers - 1} "
                  f"(--workers {cfg.workers})")
    try:
        validate_stragglers(specs, cfg.workers)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _validate_faults(cfg, family)
    _validate_out(cfg.out)
    return cfg


def _validate_faults(cfg: RunConfig, family: str) -> None:
    f = cfg.faults
    try:
        validate_faults(parse_faults(f.fail), workers=cfg.workers, shards=cfg.ps.shards, ps=family == "ps")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _int_range("--max-restarts", f.max_restarts, 0, 1000, "use an integer in 0..1000")
    _int_range("--checkpoint-every", f.checkpoint_every, 0, None, "use versions >= 0 (0 = no checkpoints)")
    if f.checkpoint_every and family != "ps":
        _fail("--checkpoint-every", f.checkpoint_every, "checkpoints PS shards; use it with ps-sync/ps-async")
    if f.on_nan not in ("skip", "stop"):
        _fail("--on-nan", f.on_nan, "choose skip or stop")


def _validate_workload(w: WorkloadConfig) -> None:
    if w.name not in WORKLOADS:
        _fail("--workload", w.name, f"choose one of {', '.join(WORKLOADS)}")
    _int_range("--batch-size", w.batch_size, 1, 1_000_000, "use a positive integer (per worker)")
    _finite("--lr", w.lr, low=0, low_ok=False, fix="use a finite learning rate > 0, e.g. 0.1")
    _finite("--grad-mb", w.grad_mb, low=0, low_ok=False, fix="use a size in MiB > 0, e.g. 4")
    if w.grad_mb > 65536:
        _fail("--grad-mb", w.grad_mb, "use at most 65536 MiB (64 GiB) per gradient")
    _finite("--compute-ms", w.compute_ms, low=0, low_ok=True, fix="use milliseconds >= 0")
    _finite("--backward-frac", w.backward_frac, low=0, low_ok=True, fix="use a fraction in [0, 1]")
    if w.backward_frac > 1:
        _fail("--backward-frac", w.backward_frac, "use a fraction in [0, 1]")
    if w.payload != "full":
        kind, _, frac = w.payload.partition(":")
        try:
            scale = float(frac)
        except ValueError:
            scale = float("nan")
        if kind != "scaled" or not (0 < scale <= 1):
            _fail("--payload", w.payload, "use 'full' or 'scaled:F' with 0 < F <= 1, e.g. scaled:0.01")
        if w.name != "synthetic":
            _fail("--payload", w.payload, "only the synthetic workload has a scalable payload")


def _validate_cluster(c: ClusterConfig) -> None:
    if c.placement not in PLACEMENTS:
        _fail("--placement", c.placement, f"choose one of {', '.join(PLACEMENTS)}")
    if c.device not in DEVICES:
        _fail("--device", c.device, f"choose one of {', '.join(DEVICES)}")
    if c.cpus_per_worker is not None:
        _finite("--cpus-per-worker", c.cpus_per_worker, low=0, low_ok=False,
                fix="use a CPU share > 0, e.g. 0.25")
    _finite("--timeout", c.timeout_s, low=0, low_ok=False, fix="use seconds > 0, e.g. 120")
    if c.address is not None and not c.address.strip():
        _fail("--address", c.address, "use 'auto' or HOST:PORT of a running Ray head")


def _validate_ps(cfg: RunConfig, family: str) -> None:
    ps, default = cfg.ps, PSConfig()
    if family != "ps":
        for flag, value, dflt in (("--ps-shards", ps.shards, default.shards),
                                  ("--staleness-bound", ps.staleness_bound, None),
                                  ("--backup-workers", ps.backup_workers, 0)):
            if value != dflt:
                _fail(flag, value, f"is a parameter-server flag; drop it or use --strategy ps-sync/ps-async (got {cfg.strategy})")
        return
    _int_range("--ps-shards", ps.shards, 1, 1024, "use an integer number of server shards >= 1")
    if ps.staleness_bound is not None:
        _int_range("--staleness-bound", ps.staleness_bound, 0, None, "use an integer >= 0 (0 = bulk synchronous)")
        if cfg.strategy != "ps-async":
            _fail("--staleness-bound", ps.staleness_bound, "bounds asynchrony; use it with --strategy ps-async")
    _int_range("--backup-workers", ps.backup_workers, 0, None, "use an integer >= 0")
    if ps.backup_workers and cfg.strategy != "ps-sync":
        _fail("--backup-workers", ps.backup_workers, "applies to --strategy ps-sync only")
    if ps.backup_workers >= cfg.workers:
        _fail("--backup-workers", ps.backup_workers,
              f"must be smaller than --workers ({cfg.workers}) so that some gradients are applied")


def _validate_ring(cfg: RunConfig, family: str) -> None:
    r, default = cfg.ring, RingConfig()
    _finite("--bucket-mb", r.bucket_mb, low=0, low_ok=False, fix="use a bucket size in MiB > 0, e.g. 25")
    if r.transport not in TRANSPORTS:
        _fail("--transport", r.transport, f"choose one of {', '.join(TRANSPORTS)}")
    if family != "allreduce" and r.transport != default.transport:
        _fail("--transport", r.transport, f"applies to --strategy ring only (got {cfg.strategy})")
    if r.algorithm not in ALGORITHMS:
        _fail("--algorithm", r.algorithm, f"choose one of {', '.join(ALGORITHMS)}")
    if family != "allreduce" and r.algorithm != default.algorithm:
        _fail("--algorithm", r.algorithm, f"applies to --strategy ring only (got {cfg.strategy})")
    if cfg.strategy == "allreduce-torch" and r.algorithm != default.algorithm:
        _fail("--algorithm", r.algorithm, "torch.distributed.all_reduce picks its own algorithm; "
              "drop --algorithm or use --strategy ring")
    if r.node_size is not None:
        _int_range("--node-size", r.node_size, 1, MAX_WORKERS, "use an integer number of workers per node >= 1")
        if r.algorithm != "hierarchical":
            _fail("--node-size", r.node_size, "groups workers into nodes for --algorithm hierarchical; "
                  f"add it or drop --node-size (got --algorithm {r.algorithm})")


# Strategies that apply --compression (allreduce-torch: the library moves the bytes).
COMPRESSION_STRATEGIES = ("ring", "gossip", "mapreduce", "ps-sync", "ps-async")


def _validate_gossip(cfg: RunConfig, family: str) -> None:
    g, default = cfg.gossip, GossipConfig()
    if g.topology not in TOPOLOGIES:
        _fail("--topology", g.topology, f"choose one of {', '.join(TOPOLOGIES)}")
    if not isinstance(g.asynchronous, bool):
        _fail("--gossip-async", g.asynchronous, "use true or false")
    if family != "gossip":
        for flag, value, dflt in (("--topology", g.topology, default.topology),
                                  ("--gossip-async", g.asynchronous, default.asynchronous)):
            if value != dflt:
                _fail(flag, value, f"is a gossip flag; drop it or use --strategy gossip (got {cfg.strategy})")


def _validate_compression(cfg: RunConfig, family: str) -> None:
    try:
        spec = parse_compression(cfg.compression)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if spec.kind == "none":
        return
    if cfg.strategy not in COMPRESSION_STRATEGIES:
        _fail("--compression", cfg.compression, f"applies to --strategy {'/'.join(COMPRESSION_STRATEGIES)} "
              f"(got {cfg.strategy}); drop it")
    if spec.kind == "topk" and family == "allreduce" and cfg.ring.algorithm != "ring":
        _fail("--compression", cfg.compression, "top-k pieces are gathered around the ring; "
              f"use --algorithm ring (got {cfg.ring.algorithm}) or fp16")
    if spec.kind == "topk" and family == "gossip":
        _fail("--compression", cfg.compression, "gossip averages parameters, not gradients, and top-k "
              "of parameters does not average; use fp16 or none")


def _validate_network(n: NetworkConfig) -> None:
    try:
        if n.bandwidth is not None:
            units.parse_bandwidth(n.bandwidth, flag="--bandwidth")
        units.parse_duration(n.latency, flag="--latency")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if n.bandwidth is None and n.latency_s > 0:
        _fail("--latency", n.latency, "emulation needs a bandwidth too; add --bandwidth, e.g. 10Gbit")


def _validate_out(out: str) -> None:
    path = os.path.abspath(out)
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        _fail("--out", out, f"{probe} is a file, not a folder; pick another --out")
    if not os.access(probe, os.W_OK | os.X_OK):
        _fail("--out", out, f"{probe} is not writable; pick a writable --out")


def with_overrides(cfg: RunConfig, **changes: Any) -> RunConfig:
    """Return a copy with top-level fields or dotted sub-fields ("ps.shards") replaced."""
    nested: dict[str, dict[str, Any]] = {}
    flat: dict[str, Any] = {}
    for key, value in changes.items():
        head, dot, tail = key.partition(".")
        if dot:
            nested.setdefault(head, {})[tail] = value
        else:
            flat[key] = value
    for head, sub in nested.items():
        flat[head] = replace(getattr(cfg, head), **sub)
    return replace(cfg, **flat)
