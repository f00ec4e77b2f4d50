"""Parse and format the sizes, bandwidths and durations given on the command line.

Syntax (a number, optional spaces, then a unit; scientific notation is allowed):

* size -> int bytes: ``1000`` (plain = bytes), ``4KB``, ``4MB``, ``1.5GB``, ``2TB``
  (decimal, x1000) and ``256KiB``, ``64MiB``, ``1GiB`` (binary, x1024). Unit letters are
  case-insensitive, so ``4kb`` == ``4KB``; a trailing ``B`` always means bytes.
* bandwidth -> float bytes/second: bits are ``bit``, ``bits``, ``bit/s``, ``bps`` or ``b/s``
  (divided by 8): ``10Gbit``, ``10Gbps``, ``400Mbit``, ``1e9bit``; bytes are ``B/s`` or
  ``Bps``: ``1.25GB/s``, ``100MB/s``. Here the suffix is case-sensitive because the
  ``b``/``B`` is the only thing separating ``Gb/s`` from ``GB/s``; prefixes are not.
  A bare number is rejected because bits-versus-bytes would be a guess.
* duration -> float seconds: ``0`` (plain = seconds), ``50ns``, ``50us``, ``50µs``,
  ``0.5ms``, ``2.5s``, ``1min``.

Every failure raises ``ValueError`` with one line naming the value and the fix.
"""

from __future__ import annotations

import math
import re

__all__ = ["format_bytes", "format_seconds", "parse_bandwidth", "parse_duration", "parse_size"]

# A strict float literal: no 'nan'/'inf' words, so those fall through to a clear error.
_NUMBER = re.compile(r"\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(.*?)\s*$", re.S)

_DECIMAL = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_BINARY = {"ki": 1024.0, "mi": 1024.0**2, "gi": 1024.0**3, "ti": 1024.0**4}
_PREFIXES = {**_DECIMAL, **_BINARY}

_SIZE_EXAMPLES = "e.g. 1000, 4KB, 256KiB, 64MiB, 1.5GB"
_BW_EXAMPLES = "e.g. 10Gbit, 400Mbit, 1.25GB/s"
_DURATION_EXAMPLES = "e.g. 0, 50us, 0.5ms, 200ms, 2.5s"

# (suffix, divisor to get bytes); 8 for bit units.
_BW_SUFFIXES = (
    ("bit/s", 8),
    ("bits", 8),
    ("bit", 8),
    ("bps", 8),
    ("b/s", 8),
    ("B/s", 1),
    ("Bps", 1),
)

# unit -> (multiplier, divisor). Sub-second units divide, so '50us' is exactly 5e-05
# rather than 50 * 1e-06 = 4.9999999999999996e-05.
_DURATION_UNITS = {
    "": (1, 1),
    "ns": (1, 1e9),
    "us": (1, 1e6),
    "\u00b5s": (1, 1e6),  # micro sign
    "\u03bcs": (1, 1e6),  # Greek mu, which some keyboards produce instead
    "ms": (1, 1e3),
    "s": (1, 1),
    "sec": (1, 1),
    "min": (60, 1),
}


def _fail(flag: str, text: object, reason: str, examples: str) -> ValueError:
    return ValueError(f"{flag} {text!r}: {reason}; {examples}")


def _split(text: object, flag: str, examples: str) -> tuple[float, str]:
    """Split TEXT into (number, unit) or raise the one-line error."""
    if not isinstance(text, str):
        raise _fail(flag, text, "must be a string", examples)
    if not text.strip():
        raise _fail(flag, text, "is empty", examples)
    match = _NUMBER.fullmatch(text)
    if match is None:
        raise _fail(flag, text, "must be a number followed by a unit", examples)
    return float(match.group(1)), match.group(2)


def _check(value: float, flag: str, text: str, examples: str, *, allow_zero: bool) -> float:
    # Overflow ("1e400GB") shows up as inf here, after the unit multiplication.
    if not math.isfinite(value):
        raise _fail(flag, text, "must be finite", examples)
    if value < 0 or (value == 0 and not allow_zero):
        raise _fail(flag, text, "must be >= 0" if allow_zero else "must be > 0", examples)
    return value


def parse_size(text: str, *, flag: str = "--size") -> int:
    """Return TEXT as a whole number of bytes (rounded to the nearest byte)."""
    number, unit = _split(text, flag, _SIZE_EXAMPLES)
    low = unit.lower()
    prefix = low[:-1] if low.endswith("b") else low
    if prefix not in _PREFIXES:
        raise _fail(flag, text, f"unknown size unit {unit!r}", _SIZE_EXAMPLES)
    value = _check(number * _PREFIXES[prefix], flag, text, _SIZE_EXAMPLES, allow_zero=True)
    return int(round(value))


def parse_bandwidth(text: str, *, flag: str = "--bandwidth") -> float:
    """Return TEXT as bytes per second (bit units are divided by 8)."""
    number, unit = _split(text, flag, _BW_EXAMPLES)
    if not unit:
        raise _fail(flag, text, "needs a unit (bits or bytes per second)", _BW_EXAMPLES)
    # Suffixes are matched case-sensitively on purpose: the b/B is the only thing that
    # separates 'Gb/s' (bits) from 'GB/s' (bytes). Longest suffixes first.
    match = next(((sfx, div) for sfx, div in _BW_SUFFIXES if unit.endswith(sfx)), None)
    prefix = unit[: -len(match[0])].lower() if match else None
    if prefix not in _PREFIXES:
        raise _fail(flag, text, f"unknown bandwidth unit {unit!r}", _BW_EXAMPLES)
    per_byte = match[1]
    value = number * _PREFIXES[prefix] / per_byte
    return _check(value, flag, text, _BW_EXAMPLES, allow_zero=False)


def parse_duration(text: str, *, flag: str = "--duration") -> float:
    """Return TEXT as seconds (a plain number is seconds)."""
    number, unit = _split(text, flag, _DURATION_EXAMPLES)
    key = unit if unit in _DURATION_UNITS else unit.lower()
    if key not in _DURATION_UNITS:
        raise _fail(flag, text, f"unknown time unit {unit!r}", _DURATION_EXAMPLES)
    multiplier, divisor = _DURATION_UNITS[key]
    return _check(number * multiplier / divisor, flag, text, _DURATION_EXAMPLES, allow_zero=True)


def _three_digits(value: float) -> str:
    # Three significant figures: enough to compare runs, short enough for a table.
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def format_bytes(n: float) -> str:
    """Return N bytes as e.g. '512 B', '4.00 KB', '1.50 GB' (decimal units)."""
    if not math.isfinite(n):
        return f"{n} B"
    sign, n = ("-" if n < 0 else ""), abs(n)
    if n < 999.5:
        return f"{sign}{n:.0f} B"
    for unit, factor in (("KB", 1e3), ("MB", 1e6), ("GB", 1e9), ("TB", 1e12)):
        # Rounding can push e.g. 999.9 KB to '1000'; move to the next unit then.
        if n / factor < 999.5 or unit == "TB":
            return f"{sign}{_three_digits(n / factor)} {unit}"
    raise AssertionError("unreachable")


def format_seconds(s: float) -> str:
    """Return S seconds as e.g. '50.0 us', '12.3 ms', '2.50 s'."""
    if not math.isfinite(s):
        return f"{s} s"
    if s == 0:
        return "0 s"
    sign, s = ("-" if s < 0 else ""), abs(s)
    for unit, factor in (("ns", 1e-9), ("us", 1e-6), ("ms", 1e-3)):
        if s / factor < 999.5:
            return f"{sign}{_three_digits(s / factor)} {unit}"
    return f"{sign}{_three_digits(s)} s"
