"""Where a measurement comes from: the code (git commit, dirty flag), the packages and the machine.

Saved with every run (config.json), every calibration file and every baseline, so a number can
be traced to what produced it. Package versions are read from their metadata, never by
importing them (torch takes seconds).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

MACHINE_CLASS = ("cpu_model", "cpu_count", "memory_gib", "arch")  # what makes machines interchangeable


def machine_class(provenance: Mapping[str, Any]) -> dict[str, Any]:
    """What makes two machines interchangeable for real-network times (MACHINE_CLASS)."""
    return {k: provenance.get(k) for k in MACHINE_CLASS}


def machine_difference(theirs: Mapping[str, Any], mine: Mapping[str, Any], *,
                       recorded_only: bool = False) -> str | None:
    """How the machine class of provenance THEIRS differs from MINE ("cpu_count 64 there, 2
    here; ..."), or None. `recorded_only`: compare only what THEIRS records (a file that names
    no machine is not said to come from another one)."""
    a, b = machine_class(theirs), machine_class(mine)
    keys = [k for k in MACHINE_CLASS if not recorded_only or a[k] is not None]
    diff = [f"{k} {a[k]!r} there, {b[k]!r} here" for k in keys if a[k] != b[k]]
    return "; ".join(diff) or None


def calibration_machine_change(path: str) -> str | None:
    """The warning for a calibration file (`--calibration`, already validated) measured on
    another machine class than this one -- the check `--check` makes of a real-network
    baseline -- or None."""
    from testbed.config.calibration import MEASURE, load_calibration

    diff = machine_difference(load_calibration(path).provenance, this_machine(), recorded_only=True)
    if diff is None:
        return None
    return (f"--calibration {path} was measured on another machine class ({diff}); its latency and "
            f"bandwidth may not be this machine's: measure this one with {MEASURE}")


def this_machine() -> dict[str, Any]:
    """This machine's class (MACHINE_CLASS), without the git and package look-ups of provenance()."""
    return {"arch": platform.machine(), "cpu_count": os.cpu_count(), "cpu_model": _cpu_model(),
            "memory_gib": _memory_gib()}


def provenance() -> dict[str, Any]:
    """Git commit + dirty flag, package versions and the machine, for config.json."""
    info: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(),
                            "arch": platform.machine(), "cpu_count": os.cpu_count(),
                            "cpu_model": _cpu_model(), "memory_gib": _memory_gib()}
    from importlib.metadata import PackageNotFoundError, version

    for mod in ("ray", "torch", "numpy", "pandas"):
        try:  # the installed version, without importing the package (torch takes seconds)
            info[mod] = version(mod)
        except PackageNotFoundError:
            info[mod] = None
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    info["git_commit"] = git("rev-parse", "HEAD")
    # --no-optional-locks: never take index.lock, so a run cannot break the user's git command.
    status = git("--no-optional-locks", "status", "--porcelain", "--untracked-files=no")
    info["git_dirty"] = None if status is None else bool(status)
    return info


def _cpu_model() -> str | None:
    """The CPU's model name (Linux /proc/cpuinfo; elsewhere platform.processor() or None)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_gib() -> int | None:
    """Physical memory, whole GiB (rounded: VMs of one size differ by a few MiB)."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return round(pages * size / 2**30)
