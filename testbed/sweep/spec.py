"""Sweep specs: read a TOML spec, check every key and value, expand the grid into points.

Pure (no Ray): `load_spec` reads and checks the file; `expand` turns its grid into validated
RunConfigs, one Point per combination x repeat, repeat-major. The spec format is described in
`testbed/sweep/cli.py`. Every problem is a one-line ConfigError naming the key and the fix.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.config import ConfigError, RunConfig, leaves, validate, with_overrides
from testbed.config.validate import strategy_keys

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

SPEC_KEYS = ("name", "repeats", "base", "grid")
SWEEP_OWNED = ("out", "quiet")  # the sweep sets these for every point


def config_keys() -> dict[str, str]:
    """Every settable spec key (dotted for sub-configs) -> its types ("int", "float", "str", "bool";
    spec strings such as compression are "str", a number-or-word such as dilation "float | str"),
    "| None" when the key may be none."""
    keys: dict[str, str] = {}
    for key, f in leaves():
        if key in SWEEP_OWNED:
            continue
        types = [t.strip() for t in str(f.type).split("|")]
        kinds = [t for t in types if t in ("int", "float", "bool", "str")]
        if f.metadata.get("parse"):  # a spec string is text, whatever it parses into
            kinds = [t for t in kinds if t in ("int", "float")] + ["str"]
        keys[key] = " | ".join(kinds or ["str"]) + (" | None" if "None" in types else "")
    return keys


def applies(key: str, strategy: str, specs: Mapping[str, Any]) -> bool:
    """Whether a key means anything for this strategy (its spec reads it, or every strategy does)."""
    if strategy not in specs or key not in strategy_keys(specs):
        return True
    return key in specs[strategy].keys


# ---------------------------------------------------------------- spec


@dataclass(frozen=True)
class Spec:
    name: str
    repeats: int
    base: dict[str, Any]
    grids: tuple[dict[str, list[Any]], ...]  # one [grid], or each [[grid]] of an array
    path: Path

    @property
    def grid(self) -> dict[str, list[Any]]:
        """Every grid key with all the values it takes in any grid (labels, tables)."""
        out: dict[str, list[Any]] = {}
        for g in self.grids:
            for k, values in g.items():
                out.setdefault(k, [])
                out[k] += [v for v in values if v not in out[k]]
        return out


@dataclass(frozen=True)
class Point:
    point_id: str
    repeat: int
    config: RunConfig
    values: dict[str, Any]  # this point's grid values, for labels


def load_spec(path: str | os.PathLike) -> Spec:
    """Read and check a spec file; raise ConfigError naming the key and the fix."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the spec ({exc.strerror}); check the path") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start}); save the spec as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML ({exc}); fix the syntax") from None
    if not data.get("base") and not data.get("grid"):
        raise ConfigError(f"{p}: the spec asks for nothing (no [base] or [grid] keys); add a [grid] "
                          "such as workers = [2, 4]")
    for key in data:
        if key not in SPEC_KEYS:
            raise ConfigError(f"{p}: key {key!r} is unknown; use {', '.join(SPEC_KEYS)}")
    name = data.get("name", p.stem)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ConfigError(f"{p}: name {name!r} must be a folder name of letters, digits, . _ -")
    from testbed.config.validate import NAME_MAX

    if len(name) > NAME_MAX:  # (letters, digits, . _ -: one byte each)
        raise ConfigError(f"{p}: name {name[:24]}... is {len(name)} characters, longer than the {NAME_MAX} "
                          "a folder name may have; give the spec a shorter name = \"...\"")
    repeats = data.get("repeats", 1)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= 1000:
        raise ConfigError(f"{p}: repeats {repeats!r} must be an integer in 1..1000, e.g. 3")
    base = _section(data, "base", p)
    tables = data.get("grid", {})
    if isinstance(tables, list):  # [[grid]] tables: the union of their products
        if not tables:
            raise ConfigError(f"{p}: grid is an empty array; add a [[grid]] table or remove it")
        grids = tuple(_grid({"grid": t}, base, p) for t in tables)
    else:
        grids = (_grid(data, base, p),)
    base = {k: _coerce(k, v, f"{p}: base.{k}") for k, v in base.items()}
    return Spec(name, repeats, base, grids, p)


def _grid(data: Mapping[str, Any], base: Mapping[str, Any], p: Path) -> dict[str, list[Any]]:
    grid = _section(data, "grid", p)
    for key, values in grid.items():
        if not isinstance(values, list):
            raise ConfigError(f"{p}: grid.{key} = {values!r} must be a list; "
                              f"write [{values!r}] or move it to [base]")
        if not values:
            raise ConfigError(f"{p}: grid.{key} is an empty list; give at least one value or remove it")
        grid[key] = [_coerce(key, v, f"{p}: grid.{key}") for v in values]
        if key in base:
            raise ConfigError(f"{p}: {key} is in both [base] and [grid]; keep one")
    return grid


def _section(data: Mapping[str, Any], section: str, p: Path) -> dict[str, Any]:
    table = data.get(section, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{p}: {section} must be a table, e.g. [{section}]")
    flat: dict[str, Any] = {}
    _flatten(table, "", flat, f"{p}: {section}")
    known = config_keys()
    for key in flat:
        if key not in known:
            hint = "set by the sweep (--out)" if key in SWEEP_OWNED else "unknown"
            raise ConfigError(f"{p}: {section}.{key} is {hint}; use RunConfig keys such as "
                              "strategy, workers, workload.grad_mb, ps.shards, network.bandwidth")
    return flat


def _flatten(table: Mapping[str, Any], prefix: str, out: dict[str, Any], where: str) -> None:
    for key, value in table.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict):
            _flatten(value, f"{full}.", out, where)
            continue
        full = "workload.name" if full == "workload" else full  # `workload = "mlp"` names it
        if full in out:
            raise ConfigError(f"{where}.{full} is given twice; keep one")
        out[full] = value


def _coerce(key: str, value: Any, where: str) -> Any:
    """Check a value against the field's type; "none" -> None for optional fields."""
    kind = config_keys()[key]
    optional = "None" in kind
    if optional and isinstance(value, str) and value.lower() == "none":
        return None
    bases = [k.strip() for k in kind.split("|") if k.strip() != "None"]
    fits = {"bool": isinstance(value, bool), "str": isinstance(value, str),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, (int, float)) and not isinstance(value, bool)}
    base = next((b for b in bases if fits[b]), None)
    if base is None:
        extra = ' or "none"' if optional else ""
        raise ConfigError(f"{where} = {value!r}: expected {' or '.join(bases)}{extra}; fix the value in the spec")
    return float(value) if base == "float" else value  # 4 and 4.0 give the same point id


# ---------------------------------------------------------------- points


def expand(spec: Spec, specs: Mapping[str, Any], runs_dir: str) -> tuple[list[Point], list[dict]]:
    """Grid -> validated points (repeat-major) and the skipped duplicate combinations."""
    configs: list[tuple[RunConfig, dict[str, Any]]] = []
    seen: dict[str, dict[str, Any]] = {}
    skipped: list[dict[str, Any]] = []
    combos = (dict(zip(g, combo, strict=True)) for g in spec.grids for combo in itertools.product(*g.values()))
    for values in combos:
        cfg = _resolve(spec, {**spec.base, **values}, specs, runs_dir)
        digest = _digest(cfg, None)
        if digest in seen:
            skipped.append({"values": values, "same_as": seen[digest]})
            continue
        seen[digest] = values
        configs.append((cfg, values))
    points = [Point(_digest(cfg, r), r, cfg, values)
              for r in range(spec.repeats) for cfg, values in configs]
    return points, skipped


def repeated(points: list[Point], spec: Spec) -> list[Point]:
    """The points once more, as the repeats after the spec's (new ids: runs of their own)."""
    return [Point(_digest(p.config, p.repeat + spec.repeats), p.repeat + spec.repeats, p.config, p.values)
            for p in points]


def _resolve(spec: Spec, values: dict[str, Any], specs: Mapping[str, Any],
             runs_dir: str) -> RunConfig:
    strategy = values.get("strategy", RunConfig().strategy)
    kept = {k: v for k, v in values.items() if applies(k, strategy, specs)}
    try:
        return validate(with_overrides(RunConfig(out=runs_dir, quiet=True), **kept), specs)
    except ConfigError as exc:
        grid = ", ".join(f"{k}={v!r}" for k, v in values.items() if k in spec.grid)
        raise ConfigError(f"{spec.path}: point {{{grid}}}: {exc}") from None


def _digest(cfg: RunConfig, repeat: int | None) -> str:
    data = {k: v for k, v in cfg.to_dict().items() if k not in SWEEP_OWNED}
    text = json.dumps({"config": data, "repeat": repeat}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def flat_config(cfg: RunConfig) -> dict[str, Any]:
    """RunConfig -> {dotted key: value} over the settable keys (spec strings as their text)."""
    d = cfg.to_dict()
    return {k: (d[k.split(".")[0]][k.split(".")[1]] if "." in k else d[k]) for k in config_keys()}


def spec_hash(spec: Spec) -> str:
    """A spec's identity (what it measures, not its file, nor how many repeats: repeat r of a
    point is the same run whatever `repeats` says): a sweep folder holds one spec's runs, and a
    baseline the curves of one spec."""
    from testbed.analysis.baseline import spec_identity

    return spec_identity(spec_dict(spec))


def spec_dict(spec: Spec) -> dict[str, Any]:
    """What a spec asks for, as JSON-able data (no path): name, repeats, base, grid."""
    grids = [{k: list(v) for k, v in g.items()} for g in spec.grids]
    return {"name": spec.name, "repeats": spec.repeats, "base": dict(spec.base),
            "grid": grids[0] if len(grids) == 1 else grids}
