"""The command line, generated from the RunConfig fields: one flag per field, grouped by concern.

Flag names, help texts and defaults are the fields' own (`schema.py`); which strategies read a
flag, and the choices of a strategy's own flags, come from the strategy specs. argparse only
collects the strings the user typed (its defaults are suppressed): the config is then built
from the dataclass defaults plus those strings, so a default is written in one place only.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from testbed.config.schema import (
    ConfigError,
    RunConfig,
    default_of,
    flag_of,
    group_of,
    leaves,
    sections,
    shown,
    with_overrides,
)
from testbed.config.validate import owners, strategy_keys, validate


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse would print usage too)
        raise ConfigError(message)


def _type(key: str) -> Any:
    """argparse type of a field: its Python type, or str for spec strings (parsed by the config)."""
    f = dict(leaves())[key]
    if f.metadata.get("parse"):
        return str
    annotation = str(f.type).split("|")[0].strip()
    return {"int": int, "float": float}.get(annotation, str)


def _help(key: str, specs: Mapping[str, Any]) -> str:
    f = dict(leaves())[key]
    text = f.metadata["help"]
    if key == "strategy":
        text += f": {', '.join(sorted(specs))}"
    options = sorted({o for spec in specs.values() for o in spec.choices.get(key, ())})
    if options:
        text += f": {', '.join(options)}"
    if key in strategy_keys(specs):
        text += f" [{', '.join(owners(specs, key))}]"
    default = default_of(key)
    if f.metadata.get("action") != "store_true" and "(default:" not in text:
        value = "none" if default is None else f"{default:g}" if isinstance(default, float) else shown(default)
        text += f" (default: {value})"
    return text.replace("%", "%%")


def build_parser(specs: Mapping[str, Any], prog: str = "python -m testbed.run",
                 description: str = "Train one job under a gradient-synchronisation strategy on Ray "
                                    "actors and measure what it costs.") -> argparse.ArgumentParser:
    p = _Parser(prog=prog, description=description, argument_default=argparse.SUPPRESS)
    titles = {"run": "run", **{name: cls.__doc__ for name, cls in sections().items()}}
    groups = {name: p.add_argument_group(title) for name, title in titles.items()}
    for key, f in leaves():
        action = f.metadata.get("action")
        kwargs: dict[str, Any] = {"dest": key, "help": _help(key, specs)}
        if action == "store_true":
            kwargs["action"] = "store_true"
        elif action == "optional":
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = _type(key)
            kwargs["metavar"] = f.metadata.get("metavar") or f.name.upper()
        groups[group_of(key)].add_argument(flag_of(key), **kwargs)
    return p


def parse_config(argv: Sequence[str] | None, specs: Mapping[str, Any]) -> RunConfig:
    """argv -> validated RunConfig (raises ConfigError with the one-line message)."""
    ns = build_parser(specs).parse_args(argv)
    return validate(with_overrides(RunConfig(), **vars(ns)), specs)
