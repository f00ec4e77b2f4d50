"""This machine's load, read from Linux /proc (None elsewhere): how busy its cores are, how much
of them the hypervisor gives to other guests, how much memory is used. Light: the benchmarks'
drivers read it before and after what they measure."""

from __future__ import annotations

import os
import time


def system_cpu_s() -> float | None:
    """CPU-seconds all cores have been busy since boot (Linux /proc/stat; None elsewhere)."""
    v = _cpu_ticks()
    return None if v is None else (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # all but idle, iowait


def stolen_cpu_s() -> float | None:
    """CPU-seconds the hypervisor has given other guests while this machine's cores wanted to
    run since boot (the `steal` column of Linux /proc/stat; None elsewhere). On a virtual
    machine it makes the same work take longer at times, whatever runs inside."""
    v = _cpu_ticks()
    return None if v is None or len(v) < 8 else v[7] / os.sysconf("SC_CLK_TCK")


def _cpu_ticks() -> list[int] | None:
    """The all-CPU line of Linux /proc/stat: user, nice, system, idle, iowait, irq, softirq,
    steal, ... in clock ticks since boot; None elsewhere."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def busy_fraction(seconds: float) -> float | None:
    """Share of all CPUs busy over the next `seconds` (a quiet-machine check)."""
    a = system_cpu_s()
    time.sleep(seconds)
    b = system_cpu_s()
    return None if a is None or b is None else (b - a) / (seconds * (os.cpu_count() or 1))


def used_memory() -> int | None:
    """The machine's used memory in bytes (MemTotal - MemAvailable), or None off Linux."""
    try:
        with open("/proc/meminfo") as fh:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in fh}
        return info["MemTotal"] - info["MemAvailable"]
    except (OSError, KeyError, ValueError, IndexError):
        return None
