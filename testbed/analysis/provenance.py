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
from pathlib import Path
from typing import Any


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
