"""This machine's load, read from Linux /proc (None elsewhere): how busy its cores are, how much
of them the hypervisor gives to other guests, how much memory is used, and how much of the CPU
a stretch of time used went to this process and its descendants (`CpuWindow`). Light: the
benchmarks' drivers and a run's read it before and after what they measure."""

from __future__ import annotations

import os
import time

BUSY_SHARE = 0.25  # other processes using this share of the CPUs make a machine busy for a measurement


def busy(share: float | None) -> bool:
    """Whether other processes' share of the CPUs (None or NaN: unknown) made the machine busy."""
    return share is not None and share == share and share >= BUSY_SHARE


def system_cpu_s() -> float | None:
    """CPU-seconds all cores have been busy since boot (Linux; None elsewhere): their time since
    boot (/proc/uptime) less their idle and iowait time (/proc/stat). Linux measures idle time
    as it starts and ends, but counts the busy columns by sampling each CPU at every tick, which
    misses short bursts: beside a run of many small messages the busy columns came out 0.205 of
    the CPUs where time less idle said 0.230 and the processes' own counters 0.227."""
    v = _cpu_ticks()
    try:
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return None if v is None else up * cpu_count() - (v[3] + v[4]) / os.sysconf("SC_CLK_TCK")


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


def cpu_count() -> int:
    """The CPUs /proc/stat counts (its per-CPU lines), which `system_cpu_s` sums over; else
    os.cpu_count()."""
    try:
        with open("/proc/stat") as f:
            n = sum(1 for line in f if line.startswith("cpu") and line[3:4].isdigit())
    except OSError:
        n = 0
    return n or os.cpu_count() or 1


def process_table() -> dict[int, tuple[int, str, int]] | None:
    """{pid: (parent pid, name, clock ticks of CPU used: utime + stime + cutime + cstime)} of
    every process (Linux /proc/PID/stat); None off Linux."""
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    table = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                data = f.read()
        except OSError:  # it ended meanwhile
            continue
        close = data.rfind(")")  # the name may hold spaces and parentheses
        fields = data[close + 2:].split()  # from field 3 (state) on
        try:
            table[pid] = (int(fields[1]), data[data.find("(") + 1:close], sum(int(x) for x in fields[11:15]))
        except (IndexError, ValueError):
            continue
    return table


def processes_below(root: int, table: dict[int, tuple[int, str, int]] | None = None) -> list[int]:
    """`root` and every process started under it that still runs (an orphan, whose parent
    ended, is init's or a subreaper's, no longer below)."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in (table or {}).items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def tree_cpu_s(root: int) -> tuple[float, bool] | None:
    """CPU-seconds process `root` and its descendants have used, the ones they have reaped
    included, and whether a Ray raylet is among them (so Ray's processes are this tree's); None
    off Linux.

    Over a stretch of time, the difference of two readings is what the tree used in it: a
    descendant that ended meanwhile was reaped by its parent, a descendant too, whose cutime
    then holds all of it (what the first reading already had of it is taken away again)."""
    table = process_table()
    if not table or root not in table:
        return None
    tree = [table[pid] for pid in processes_below(root, table) if pid in table]
    ticks = sum(t for _, _, t in tree)
    return ticks / os.sysconf("SC_CLK_TCK"), any(name == "raylet" for _, name, _ in tree)


class CpuWindow:
    """How busy the machine's CPUs were from construction to `shares()`, and how much of that
    was not this process's tree (`foreign`): other users' work, which slows what a run measures
    (an emulated run's per-message cost shows as lateness, a busier machine needs a larger
    --dilation). The tree counts only where Ray's processes are in it (a Ray this process
    started); attached to another Ray, its workers are not, so foreign is None (`ray=False`: the
    tree is all of the work to count, Ray or not)."""

    def __init__(self, root: int | None = None, *, ray: bool = True) -> None:
        self.root, self.ray = os.getpid() if root is None else root, ray
        self.t0, self.system0, self.tree0 = time.monotonic(), system_cpu_s(), tree_cpu_s(self.root)
        self.capacity_s = 0.0

    def shares(self) -> dict[str, float | None]:
        """`machine_cpu_busy`: the share of all CPUs busy; `foreign_cpu_share`: the share busy
        outside this tree (None where it cannot be told); both of the time since construction."""
        system1, tree1 = system_cpu_s(), tree_cpu_s(self.root)
        capacity = self.capacity_s = (time.monotonic() - self.t0) * cpu_count()  # CPU-seconds the window had
        if self.system0 is None or system1 is None or capacity <= 0:
            return {"machine_cpu_busy": None, "foreign_cpu_share": None}
        busy = system1 - self.system0
        foreign = None
        if self.tree0 is not None and tree1 is not None and (tree1[1] or not self.ray):
            foreign = (busy - (tree1[0] - self.tree0[0])) / capacity
        return {"machine_cpu_busy": busy / capacity, "foreign_cpu_share": foreign}
