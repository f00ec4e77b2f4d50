"""The run configuration: frozen dataclasses whose fields carry everything said about them once.

Each leaf field's metadata names its flag, its help text, its check and, for the spec strings
(`--straggler`, `--fail`, `--compression`, `--payload`), how the text becomes a typed value and
back. The defaults here are the only defaults: the command line (`flags.py`), sweeps
(`testbed.sweepspec`) and `config.json` (`from_dict`) all build a `RunConfig` through these
classes, and a spec string is parsed once, when the dataclass is built. A bad spec string
raises `ConfigError`, whose text is the one line the user sees.

Which fields apply to which strategy is not said here: each strategy says which keys it reads
(`testbed.strategy.StrategySpec.keys`) and `validate.py` rejects the others. The workload and
evaluation sections live in `workload.py`, with the table of which workload reads which key.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, field, fields, replace
from typing import Any

from testbed import units
from testbed.config.checks import choice, integer, real
from testbed.config.compression import CompressionSpec, parse_compression
from testbed.config.faults import Faults, parse_faults_spec
from testbed.config.fields import ConfigError, opt
from testbed.config.fields import parse_fields as _parse_fields
from testbed.config.payload import Payload
from testbed.config.stragglers import Stragglers, parse_stragglers_spec
from testbed.config.workload import EvalConfig, WorkloadConfig

MAX_WORKERS = 4096  # far past what one Ray cluster here can place; resources are checked later
DEVICES = ("auto", "cpu", "cuda")
PLACEMENTS = ("pack", "spread")
PS_PLACEMENTS = ("dedicated", "colocated")


# ---------------------------------------------------------------- the configuration


@dataclass(frozen=True)
class ClusterConfig:
    """cluster (Ray, placement, resources)"""

    address: str | None = opt(None, metavar="auto|HOST:PORT",
                              help="Ray cluster to attach to (default: a private local Ray)")
    placement: str = opt("pack", check=choice(PLACEMENTS), help="placement group: pack or spread")
    device: str = opt("auto", check=choice(DEVICES), help="cpu, cuda or auto (cuda when the cluster has GPUs)")
    cpus_per_worker: float | None = opt(None, check=real(0, None, low_ok=False, fix="use a CPU share > 0, e.g. 0.25"),
                                        help="CPU share per worker; a process of K workers gets K (default: an even share, <= 1)")
    workers_per_process: int | None = opt(None, check=integer(1, MAX_WORKERS, "use a positive integer, e.g. 8"),
                                          metavar="K",
                                          help="logical workers sharing one actor process, each with its own NIC, "
                                               "data and optimizer state (default: 1 up to 16 workers or on a Ray "
                                               "cluster; beyond, on a local Ray, at most 8 processes wherever "
                                               "sharing is allowed: testbed.config.validate)")
    timeout_s: float = opt(120.0, flag="--timeout", check=real(0, None, low_ok=False, fix="use seconds > 0, e.g. 120"),
                           help="seconds any remote wait may take (a hang becomes an error or a restart)")


@dataclass(frozen=True)
class PSConfig:
    """parameter server"""

    shards: int = opt(1, flag="--ps-shards", check=integer(1, 1024, "use an integer number of server shards >= 1"),
                      help="parameter-server shards, balanced by bytes")
    staleness_bound: int | None = opt(None, check=integer(0, None, "use an integer >= 0 (0 = bulk synchronous)"),
                                      help="stale-synchronous parallel: clock bound s (default: none)")
    backup_workers: int = opt(0, check=integer(0, None, "use an integer >= 0"),
                              help="apply after the first N-b gradients of a step, drop the rest")
    servers: int | None = opt(None, flag="--ps-servers", check=integer(1, 1024, "use an integer number of servers >= 1"),
                              help="the k of 'n workers + k servers': the same count as --ps-shards")
    placement: str = opt("dedicated", flag="--ps-placement", check=choice(PS_PLACEMENTS),
                         help="dedicated: each server its own machine and NIC; colocated: server i "
                              "shares worker i's machine and NIC")
    partition_mb: float = opt(4.0, flag="--ps-partition-mb", check=real(0, None, fix="use a size in MiB >= 0 (0: off), e.g. 4"),
                              help="push, average and pull the gradient in partitions of at most this "
                                   "many MiB, so pulls overlap pushes (0: one per server)")

    @property
    def count(self) -> int:
        """Server actors: --ps-servers where given, else --ps-shards (validate refuses a conflict)."""
        return self.shards if self.servers is None else self.servers


@dataclass(frozen=True)
class RingConfig:
    """allreduce"""

    bucket_mb: float = opt(25.0, check=real(0, None, low_ok=False, fix="use a bucket size in MiB > 0, e.g. 25"),
                           help="gradient bucket size (MiB)")
    first_bucket_mb: float = opt(1.0, check=real(0, None, low_ok=False, fix="use a size in MiB > 0, e.g. 1"),
                                 help="cap of the first bucket (last layers), as DDP's 1 MiB")
    overlap: bool = opt(True, action="optional", help="allreduce buckets while backward runs")
    transport: str = opt("object-store", help="object-store (Ray shared-memory channels) or torch (gloo/NCCL p2p)")
    algorithm: str = opt("ring", help="how a bucket is summed")
    node_size: int | None = opt(None, check=integer(1, MAX_WORKERS, "use an integer number of workers per node >= 1"),
                                help="hierarchical: workers per emulated node (default: one node per Ray node)")


@dataclass(frozen=True)
class GossipConfig:
    """decentralised (gossip)"""

    topology: str = opt("ring", help="neighbour graph")
    asynchronous: bool = opt(False, flag="--gossip-async", action="store_true",
                             help="pairwise asynchronous averaging instead of rounds")


@dataclass(frozen=True)
class NetworkConfig:
    """network emulation"""

    bandwidth: str | None = opt(None, metavar="RATE", help="emulate a network: NIC bandwidth, e.g. 10Gbit "
                                "(default: the real network)")
    latency: str = opt("0us", metavar="TIME", help="emulated one-way latency, e.g. 50us")
    dilation: float = opt(1.0, metavar="D", check=real(1, 100_000, fix="use a factor >= 1, e.g. 10"),
                          help="run the emulated cluster D times slower (transfers, latency, "
                               "synthetic compute, straggler delays) and report every time divided "
                               "by D, so this machine's own overheads shrink D-fold (docs/emulation.md)")
    calibration: str | None = opt(None, metavar="FILE", help="real network: predict with the latency and "
                                  "bandwidth measured by python -m testbed.bench network --out FILE")

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
    """stragglers and faults"""

    fail: Faults = opt(factory=Faults, parse=parse_faults_spec, metavar="SPEC",
                       help="inject faults, e.g. worker=2,at=10 or nan:worker=1,at=3 (docs/faults.md)")
    max_restarts: int = opt(3, check=integer(0, 1000, "use an integer in 0..1000"), help="restarts allowed per actor")
    checkpoint_every: int = opt(0, check=integer(0, None, "use versions >= 0 (0 = no checkpoints)"),
                                help="checkpoint PS shards every K versions (0: none)")
    on_nan: str = opt("skip", check=choice(("skip", "stop")),
                      help="a non-finite gradient: skip it (recorded) or stop the run as diverged")
    max_skipped: int = opt(10, check=integer(0, 10**9, "use an integer >= 0"),
                           help="non-finite gradients skipped before the run stops as diverged")

    def __post_init__(self) -> None:
        _parse_fields(self)


@dataclass(frozen=True)
class RunConfig:
    strategy: str = opt("ring", help="synchronisation strategy")
    workers: int = opt(4, check=integer(1, MAX_WORKERS, f"use an integer in 1..{MAX_WORKERS}"),
                       help="data-parallel workers (actors)")
    steps: int = opt(100, check=integer(1, 10_000_000, "use a positive integer number of updates"),
                     help="model updates to apply (sync: global steps; async: applied gradients)")
    seed: int = opt(0, check=integer(0, 2**32 - 1, "use an integer in 0..2**32-1"),
                    help="data order, initial parameters, straggler delays, synthetic gradients")
    out: str = opt("results/runs", metavar="DIR", help="folder that receives the run folder")
    quiet: bool = opt(False, action="store_true", help="print only the run folder path")
    timeline: bool = opt(False, action="store_true", help="also write timeline.json (Chrome trace)")
    compression: CompressionSpec = opt(factory=CompressionSpec, parse=parse_compression,
                                       metavar="none|fp16|topk:F", help="gradient compression (bytes counted after it)")
    straggler: Stragglers = opt(factory=Stragglers, parse=parse_stragglers_spec, metavar="SPEC", group="faults",
                                help="injected delays, e.g. fixed:worker=3,delay=200ms (docs/emulation.md)")
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    ps: PSConfig = field(default_factory=PSConfig)
    ring: RingConfig = field(default_factory=RingConfig)
    gossip: GossipConfig = field(default_factory=GossipConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        _parse_fields(self)

    def to_dict(self) -> dict[str, Any]:
        """Nested plain data (typed spec values as their canonical text): config.json."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in SECTIONS:
                out[f.name] = {s.name: _as_data(getattr(value, s.name)) for s in fields(value)}
            else:
                out[f.name] = _as_data(value)
        return out

    @property
    def grad_bytes_logical(self) -> int | None:
        """Logical gradient bytes of the synthetic workload (None for real models)."""
        if self.workload.real_compute:
            return None
        return int(self.workload.grad_mb * 2**20)


# The sub-configurations: fields of RunConfig whose value is a section dataclass (not a spec string).
SECTIONS: dict[str, type] = {f.name: f.default_factory for f in fields(RunConfig)
                             if f.default_factory is not MISSING and "parse" not in f.metadata}


def _as_data(value: Any) -> Any:
    if isinstance(value, (CompressionSpec, Payload, Stragglers, Faults)):
        return str(value)
    return value


def leaves() -> list[tuple[str, Field]]:
    """Every settable field as (dotted key, Field), in declaration order."""
    out = []
    for f in fields(RunConfig):
        if f.name in SECTIONS:
            out += [(f"{f.name}.{s.name}", s) for s in fields(SECTIONS[f.name])]
        else:
            out.append((f.name, f))
    return out


def flag_of(key: str) -> str:
    """The command-line flag of a dotted key ('ps.shards' -> '--ps-shards')."""
    f = dict(leaves())[key]
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def group_of(key: str) -> str:
    f = dict(leaves())[key]
    return f.metadata.get("group") or (key.split(".")[0] if "." in key else "run")


def default_of(key: str) -> Any:
    f = dict(leaves())[key]
    return f.default_factory() if f.default is MISSING else f.default


def get(cfg: RunConfig, key: str) -> Any:
    head, _, tail = key.partition(".")
    value = getattr(cfg, head)
    return getattr(value, tail) if tail else value


def shown(value: Any) -> Any:
    """A value as the user wrote it, for messages (spec strings keep their source text)."""
    source = getattr(value, "source", None)
    if source is not None:
        return source
    return str(value) if isinstance(value, (CompressionSpec, Payload)) else value


def from_dict(data: dict[str, Any]) -> RunConfig:
    """Rebuild a RunConfig from `to_dict()` output (e.g. a saved config.json)."""
    names = {f.name for f in fields(RunConfig)}
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            continue
        kwargs[key] = SECTIONS[key](**value) if key in SECTIONS else value
    return RunConfig(**kwargs)


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


__all__ = ["ClusterConfig", "ConfigError", "EvalConfig", "FaultConfig", "Faults", "GossipConfig", "NetworkConfig",
           "PSConfig", "Payload", "RingConfig", "RunConfig", "Stragglers", "WorkloadConfig",
           "default_of", "flag_of", "from_dict", "get", "group_of", "leaves", "shown", "with_overrides"]
