"""The run configuration: frozen dataclasses whose fields carry everything said about them once.

Each leaf field's metadata names its flag, its help text, its check and, for the spec strings
(`--straggler`, `--fail`, `--compression`, `--payload`), how the text becomes a typed value and
back. The defaults here are the only defaults: the command line (`flags.py`), sweeps
(`testbed.sweep.spec`) and `config.json` (`from_dict`) all build a `RunConfig` through these
classes, and a spec string is parsed once, when the dataclass is built. A bad spec string
raises `ConfigError`, whose text is the one line the user sees.

Which fields apply to which strategy is not said here: each strategy says which keys it reads
(`testbed.strategies.contract.StrategySpec.keys`) and `validate.py` rejects the others. The workload and
evaluation sections live in `workload.py`, with the table of which workload reads which key.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from typing import Any

from testbed.config.checks import choice, integer, real
from testbed.config.compressionspec import CompressionSpec, parse_compression
from testbed.config.faultspec import Faults, parse_faults_spec
from testbed.config.fields import ConfigError, opt
from testbed.config.fields import parse_fields as _parse_fields
from testbed.config.payload import Payload
from testbed.config.stragglerspec import Stragglers, parse_stragglers_spec
from testbed.config.workload import EvalConfig, WorkloadConfig
from testbed.util import units

AUTO = "auto"  # --dilation auto (NetworkConfig.auto_dilation)


def parse_dilation(text: str) -> float | str:
    """--dilation: a factor, or AUTO."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"--dilation {text!r}: use a factor >= 1, e.g. 10, or auto") from None


def check_dilation(value: Any) -> str | None:
    return None if value == AUTO else _FACTOR(value)


_FACTOR = real(1, 100_000, fix="use a factor >= 1, e.g. 10, or auto")


def parse_real_workers(text: str) -> int | str:
    """--real-workers: a count, or AUTO."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--real-workers {text!r}: use a count of workers >= 1, e.g. 8, or auto") from None


def check_real_workers(value: Any) -> str | None:
    return None if value == AUTO else _REAL_COUNT(value)

MAX_WORKERS = 4096  # far past what one Ray cluster here can place; resources are checked later
_REAL_COUNT = integer(1, MAX_WORKERS, "use a count of workers >= 1, e.g. 8, or auto")
DEVICES = ("auto", "cpu", "cuda")
PLACEMENTS = ("pack", "spread")


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
                           help="seconds any remote wait may take (a hang becomes an error or a restart); "
                                "--dilation auto multiplies it by the factor it picks")
    real_workers: int | str | None = opt(None, metavar="K|auto", parse=parse_real_workers, check=check_real_workers,
                                         help="start K of the workers as processes; they play the others, emulated "
                                              "peers at the model's times (docs/emulation.md, \"Emulated peers\"); "
                                              "auto: all real up to 16 workers; beyond, 16 real where the strategy "
                                              "has emulated peers, else all (default: auto)")

    def __post_init__(self) -> None:
        _parse_fields(self)  # --real-workers: a count, or AUTO


@dataclass(frozen=True)
class NetworkConfig:
    """network emulation"""

    bandwidth: str | None = opt(None, metavar="RATE", help="emulate a network: NIC bandwidth, e.g. 10Gbit "
                                "(default: the real network)")
    latency: str = opt("0us", metavar="TIME", help="emulated one-way latency, e.g. 50us")
    dilation: float | str | None = opt(None, metavar="D|auto", parse=parse_dilation, check=check_dilation,
                                       help="run the emulated cluster D times slower (transfers, latency, "
                                            "synthetic compute, straggler delays) and report every time "
                                            "divided by D, so this machine's own overheads shrink D-fold; "
                                            "auto: short trial runs raise D until the run is faithful "
                                            "(docs/emulation.md) (default: auto on an emulated network with "
                                            "synthetic compute, else 1)")
    fidelity_budget_s: float = opt(300.0, flag="--fidelity-budget", metavar="SECONDS",
                                   check=real(0, 86_400, low_ok=False, fix="use seconds > 0, e.g. 300"),
                                   help="--dilation auto: the wall time its trial runs and the run itself "
                                        "may take together")
    calibration: str | None = opt(None, metavar="FILE", help="real network: predict with the latency and "
                                  "bandwidth measured by python -m testbed.bench network --out FILE")

    def __post_init__(self) -> None:
        # the rate and the delay as numbers, parsed once, here: the text stays what the user
        # wrote (config.json, messages), and a text that is no rate is the user's one-line error
        _parse_fields(self)  # --dilation: a number, or AUTO
        try:
            rate = None if self.bandwidth is None else units.parse_bandwidth(self.bandwidth, flag="--bandwidth")
            delay = units.parse_duration(self.latency, flag="--latency")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        object.__setattr__(self, "_parsed", (rate, delay))

    def resolved(self, real_compute: bool) -> NetworkConfig:
        """--dilation left out, made explicit (testbed.config.validate does, once): auto on an
        emulated network where every time can be stretched (synthetic compute), else 1."""
        if self.dilation is not None:
            return self
        return replace(self, dilation=AUTO if self.emulated and not real_compute else 1.0)

    @property
    def factor(self) -> float:
        """The dilation the run goes at: a number (validation resolved the default, and the
        --dilation auto search put its factor in place); 1 in a config built in code and never
        validated, whose network is then the real one or undilated."""
        if self.dilation == AUTO:
            raise ValueError("--dilation auto is resolved by the session's search "
                             "(testbed.session.autodilate) before anything runs")
        return 1.0 if self.dilation is None else float(self.dilation)

    @property
    def auto_dilation(self) -> bool:
        """--dilation auto: the session picks the factor (testbed.session.autodilate) and runs
        the config with that number in its place; nothing past it sees AUTO."""
        return self.dilation == AUTO

    @property
    def emulated(self) -> bool:
        return self.bandwidth is not None

    @property
    def bandwidth_Bps(self) -> float | None:
        """The emulated NIC's rate, bytes/s (None: the real network)."""
        return self._parsed[0]

    @property
    def latency_s(self) -> float:
        """The emulated one-way latency, seconds."""
        return self._parsed[1]

    @property
    def wire(self) -> tuple[float, float] | None:
        """(bytes/s, s) the emulator actually runs at: --dilation D stretches the cluster D-fold,
        so the link is D times slower and its latency D times longer (None: not emulated)."""
        if self.bandwidth is None:
            return None
        return self._parsed[0] / self.factor, self._parsed[1] * self.factor


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


# ---------------------------------------------------------------- strategy sections
# A strategy package owns its config section: a frozen dataclass of `opt` fields (e.g.
# testbed.ps.config.PSConfig) that its spec names (`StrategySpec.sections`, name -> class). The
# registry hands every spec's sections to `use_sections` when it is imported; building a RunConfig
# asks for them first (`strategy_sections`), importing the registry if nothing has yet -- the one
# place the config reaches up, as a plugin host loads its plugins. A section is then read as an
# attribute (`cfg.ps.shards`), keyed as 'ps.shards', flagged, saved and loaded like the config's
# own sections.
_STRATEGY_SECTIONS: dict[str, type] = {}


def use_sections(sections: Mapping[str, type]) -> None:
    """Add strategy sections (name -> dataclass); the registry calls this once per spec."""
    core = {f.name for f in fields(RunConfig)}
    for name, cls in sections.items():
        known = _STRATEGY_SECTIONS.get(name)
        if name in core or (known is not None and known is not cls):
            raise ValueError(f"config section {name!r}: already taken; give {cls.__name__} another name")
        _STRATEGY_SECTIONS[name] = cls


def strategy_sections() -> dict[str, type]:
    """The registered strategies' sections, in registry order."""
    if not _STRATEGY_SECTIONS:
        importlib.import_module("testbed.strategies.registry")  # its import registers them
    return dict(_STRATEGY_SECTIONS)


@dataclass(frozen=True, init=False)
class RunConfig:
    """One run's configuration. Built with keyword arguments: its own fields, and the strategy
    sections by name (`RunConfig(ps=PSConfig(shards=2))`); every field not given takes its default."""

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
    # the strategies' sections, name -> section value (see "strategy sections" above)
    options: Mapping[str, Any] = field(default_factory=dict, hash=False, metadata={"strategies": True})
    network: NetworkConfig = field(default_factory=NetworkConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __init__(self, **given: Any) -> None:
        known = strategy_sections()
        options = dict(given.pop("options", None) or {})
        options.update({name: given.pop(name) for name in list(given) if name in known})
        for f in fields(self):
            if f.name == "options":
                continue
            value = given.pop(f.name) if f.name in given else (
                f.default_factory() if f.default is MISSING else f.default)
            object.__setattr__(self, f.name, value)
        unknown = sorted(given) + sorted(set(options) - set(known))
        if unknown:
            raise TypeError(f"RunConfig: no field or strategy section {', '.join(unknown)}")
        object.__setattr__(self, "options", {name: options[name] if name in options else cls()
                                             for name, cls in known.items()})
        _parse_fields(self)

    def __getattr__(self, name: str) -> Any:
        """A strategy section as an attribute (only asked for names that are not fields)."""
        options = self.__dict__.get("options") or {}
        if name in options:
            return options[name]
        raise AttributeError(f"RunConfig has no field or strategy section {name!r}")

    def to_dict(self) -> dict[str, Any]:
        """Nested plain data (typed spec values as their canonical text): config.json."""
        out: dict[str, Any] = {}
        for name, value in _items(self):
            if name in sections():
                out[name] = {s.name: _as_data(getattr(value, s.name)) for s in fields(value)}
            else:
                out[name] = _as_data(value)
        return out

    @property
    def real_workers(self) -> int:
        """The workers started as processes: --real-workers (validation resolves auto), every
        worker in a config built in code and never validated. The rest are emulated peers
        (testbed.emulation.peers)."""
        k = self.cluster.real_workers
        return k if isinstance(k, int) else self.workers

    @property
    def grad_bytes_logical(self) -> int | None:
        """Logical gradient bytes of the synthetic workload (None for real models)."""
        if self.workload.real_compute:
            return None
        return int(self.workload.grad_mb * 2**20)


def _items(cfg: RunConfig) -> list[tuple[str, Any]]:
    """(name, value) of every field, the strategy sections in the place of `options`."""
    out: list[tuple[str, Any]] = []
    for f in fields(cfg):
        out += list(cfg.options.items()) if f.name == "options" else [(f.name, getattr(cfg, f.name))]
    return out


def sections() -> dict[str, type]:
    """Every section (a field whose value is a dataclass of fields, not a spec string), name ->
    class, in declaration order, the strategy sections in the place of `options`."""
    out: dict[str, type] = {}
    for f in fields(RunConfig):
        if f.name == "options":
            out.update(strategy_sections())
        elif f.default_factory is not MISSING and "parse" not in f.metadata:
            out[f.name] = f.default_factory
    return out


def _as_data(value: Any) -> Any:
    if isinstance(value, (CompressionSpec, Payload, Stragglers, Faults)):
        return str(value)
    return value


def leaves() -> list[tuple[str, Field]]:
    """Every settable field as (dotted key, Field), in declaration order."""
    out = []
    every = sections()
    for f in fields(RunConfig):
        if f.name == "options":
            out += [(f"{name}.{s.name}", s) for name, cls in strategy_sections().items() for s in fields(cls)]
        elif f.name in every:
            out += [(f"{f.name}.{s.name}", s) for s in fields(every[f.name])]
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
    every = sections()
    names = ({f.name for f in fields(RunConfig)} | set(every)) - {"options"}
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            continue
        kwargs[key] = every[key](**value) if key in every else value
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


__all__ = ["ClusterConfig", "ConfigError", "EvalConfig", "FaultConfig", "Faults", "NetworkConfig",
           "Payload", "RunConfig", "Stragglers", "WorkloadConfig", "default_of", "flag_of", "from_dict",
           "get", "group_of", "leaves", "sections", "shown", "strategy_sections", "use_sections",
           "with_overrides"]
