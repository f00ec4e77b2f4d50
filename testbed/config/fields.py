"""What a config field is: its default, flag, help, check and parser in one place (`opt`), and
the one error a bad input raises (`ConfigError`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, field, fields
from typing import Any


class ConfigError(ValueError):
    """A user input is wrong; the message is one line naming the value and the fix."""

    def __init__(self, message: str) -> None:
        # user text can carry line breaks; the message stays one line whatever they typed
        super().__init__(str(message).replace("\r", "\\r").replace("\n", "\\n"))


def opt(default: Any = MISSING, *, help: str, flag: str | None = None, check: Callable | None = None,
        parse: Callable[[str], Any] | None = None, action: str | None = None,
        factory: Callable[[], Any] | None = None, group: str | None = None,
        metavar: str | None = None) -> Any:
    """A config field: default, flag (default: --name-with-dashes), help, check, parser."""
    meta = {"help": help, "flag": flag, "check": check, "parse": parse, "action": action,
            "group": group, "metavar": metavar}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def parse_fields(obj: Any) -> None:
    """Turn spec strings into their typed values, once, when the dataclass is built."""
    for f in fields(obj):
        parse = f.metadata.get("parse")
        value = getattr(obj, f.name)
        if parse is not None and isinstance(value, str):
            try:
                object.__setattr__(obj, f.name, parse(value))
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
