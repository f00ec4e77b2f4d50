"""Checks a config field declares: each returns None for a good value, else the fix to print."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

Check = Callable[[Any], "str | None"]


def _above(high: float, fix: str) -> str:
    """The fix for a value past the upper limit: the limit first (the fix alone may only say
    'positive'), then the fix."""
    return f"at most {high if isinstance(high, int) else format(high, 'g')}; {fix}"


def integer(low: int, high: int | None, fix: str) -> Check:
    """An int (not a bool) in [low, high] (high None: no upper bound)."""
    def check(value: Any) -> str | None:
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            return fix
        return None if high is None or value <= high else _above(high, fix)
    return check


def real(low: float, high: float | None, *, fix: str, low_ok: bool = True) -> Check:
    """A finite int or float (not a bool) above low (or equal, if low_ok) and at most high."""
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return fix
        if value < low or (value == low and not low_ok):
            return fix
        return None if high is None or value <= high else _above(high, fix)
    return check


def choice(options: Sequence[str]) -> Check:
    def check(value: Any) -> str | None:
        return None if value in options else f"choose one of {', '.join(options)}"
    check.options = tuple(options)  # type: ignore[attr-defined]  # (read by tests and docs)
    return check
