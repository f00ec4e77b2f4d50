"""The run configuration: frozen dataclasses whose fields carry everything said about them once.

Each leaf field's metadata names its flag, its help text, its check and, for the spec strings
(`--straggler`, `--fail`, `--compression`, `--payload`), how the text becomes a typed value and
back. The defaults here are the only defaults: the command line (`flags.py`), sweeps
(`testbed.sweep.spec`) and `config.json` (`from_dict`) all build a `RunConfig` through these
classes, and a spec string is parsed once, when the dataclass is built. A bad spec string
raises `ConfigError`, whose text is the one line the user sees.

Which fields apply to which strategy is not said here: each strategy says which keys it reads
(`testbed.strategies.contract.StrategySpec.keys`) and `validate.py` rejects the others. The workload and
evaluation sections live in `workload.py`, with the table of which workload reads which key; the
cluster, network and faults sections in `environment.py`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from typing import Any

from testbed.config.checks import integer
from testbed.config.compressionspec import CompressionSpec, parse_compression
from testbed.config.environment import MAX_WORKERS, ClusterConfig, FaultConfig, NetworkConfig
from testbed.config.faultspec import Faults
from testbed.config.fields import ConfigError, opt
from testbed.config.fields import parse_fields as _parse_fields
from testbed.config.payload import Payload
from testbed.config.stragglerspec import Stragglers, parse_stragglers_spec
from testbed.config.workload import EvalConfig, WorkloadConfig

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
