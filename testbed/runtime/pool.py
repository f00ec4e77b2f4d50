"""Worker processes kept warm between the runs of one driver (none unless a driver installs a pool).

Why: on the 2-core machine a Ray actor process takes 0.3-0.5 s to start, so a run of three
synthetic workers spends 1.3-1.7 s creating its actors and 0.05 s training. A driver that runs
many short runs in one Ray -- the test suite runs some two hundred -- spends most of its time
starting processes. With a pool installed (`install`), a run's workers are built inside
processes an earlier run of the same driver used, and the processes are given back when the
run ends instead of being killed:

    run A   spawn -> take 3 hosts (new) -> Host.load(epoch 1, PSWorker, ...)  ... kill_all -> unload, idle
    run B   spawn -> take 3 hosts (idle) -> Host.load(epoch 2, RingPeer, ...) ... kill_all -> unload, idle

What stays as it was: every worker is a new object built from the run's config (its data shard,
optimizer state, emulated NIC, straggler model, random state), in a process of its own as
before (`testbed.runtime.hosting.Host`, one rank each unless --workers-per-process groups
them), talking over the same calls and channels. A call carries its run's epoch, so a late call
of an earlier run is refused (`hosting.StaleCall`) and never reaches a later run's worker.

What would differ, and so where a run gets fresh processes of its own (`admits`):
- the process start-up is not part of the run: no command a user runs (`python -m testbed.run`,
  `testbed.sweep`, the benchmarks) installs a pool; a run that starts its own Ray never uses one;
- pooled processes are outside the run's placement group: on one node that changes nothing a
  run measures, across nodes it would change the placement, so only one-node clusters;
- an injected fault that kills or stalls a process (`--fail` kill, hang, sent): Ray's restart
  of a pooled one would rebuild an empty host, so such runs get their own processes, with
  their own restarts (a NaN gradient, `nan:`, does neither: its runs may be hosted);
- a CUDA context and its memory would carry over: runs on a GPU get their own processes.

A process is reused only when its run ends with none of its calls still running (`Host.unload`,
after a short grace), for at most MAX_USES runs (Ray frees a channel's buffer only with its
writer's process), and at most MAX_IDLE wait at a time; the rest are killed as before.
"""

from __future__ import annotations

import itertools
from typing import Any

import ray

MAX_IDLE = 16  # idle processes kept per driver (about 110 MiB each, 300 MiB once a run imported torch)
MAX_USES = 25  # runs one process serves before it is replaced
MIN_THREADS = 16
GIVE_BACK_S = 5.0  # how long the processes of an ended run get to unload


class ProcessPool:
    """Idle `Host` processes by their thread limit, and the ones lent to a running run."""

    def __init__(self, max_idle: int = MAX_IDLE, max_uses: int = MAX_USES) -> None:
        self.max_idle, self.max_uses = max_idle, max_uses
        self.idle: dict[int, list[Any]] = {}  # max_concurrency -> idle host handles
        self.hosts: dict[int, tuple[Any, int]] = {}  # id(handle) -> (handle, its max_concurrency)
        self.uses: dict[int, int] = {}  # id(handle) -> runs it served
        self.epochs = itertools.count(1)
        self.created = self.reused = 0

    @staticmethod
    def admits(cluster: Any, config: Any) -> str | None:
        """Why this run must have processes of its own (None: the pool may host it)."""
        if cluster.started_ray:
            return "the run started its own Ray"
        if cluster.nodes_at_start != 1:
            return "the cluster has several nodes (placement matters)"
        if cluster.device != "cpu":
            return "the run uses a GPU"
        faults = getattr(config, "faults", None)
        if faults is None:
            return "no run config to judge by"
        if any(f.kind != "nan" for f in faults.fail.items):
            return "the run injects faults that kill or stall a process (--fail)"
        return None

    def take(self, remote_host: Any, threads: int, count: int) -> tuple[list[Any], int]:
        """`count` hosts that run at least `threads` calls at once (idle ones first, new ones of
        `remote_host`, the Ray actor class of `hosting.Host`, for the rest) and the epoch the
        run's workers are to be loaded under."""
        limit = thread_limit(threads)
        idle = self.idle.setdefault(limit, [])
        hosts = [idle.pop() for _ in range(min(count, len(idle)))]
        self.reused += len(hosts)
        for _ in range(count - len(hosts)):
            h = remote_host.options(num_cpus=0, max_concurrency=limit, max_restarts=0, max_task_retries=0).remote()
            self.hosts[id(h)], self.uses[id(h)] = (h, limit), 0
            hosts.append(h)
            self.created += 1
        for h in hosts:
            self.uses[id(h)] += 1
        return hosts, next(self.epochs)

    def lent(self, handle: Any) -> bool:
        """Whether a process handle is one of this pool's."""
        return self.hosts.get(id(handle), (None, 0))[0] is handle

    def give_back(self, hosts: list[Any]) -> None:
        """The processes of an ended run: idle ones wait for the next run, the rest are killed."""
        refs = [h.unload.remote() for h in hosts]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=GIVE_BACK_S)
        for h, ref in zip(hosts, refs, strict=True):
            fit = False
            if ref in ready:
                try:
                    fit = bool(ray.get(ref))
                except Exception:  # noqa: BLE001 - a dead or failing process is not reused
                    fit = False
            idle = self.idle.setdefault(self.hosts[id(h)][1], [])
            if fit and self.uses[id(h)] < self.max_uses and sum(map(len, self.idle.values())) < self.max_idle:
                idle.append(h)
                continue
            self._drop(h)

    def _drop(self, h: Any) -> None:
        self.hosts.pop(id(h), None)
        self.uses.pop(id(h), None)
        try:
            ray.kill(h, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead is fine
            pass

    def clear(self, kill: bool = True) -> None:
        """Forget every process (killing the idle ones unless Ray is going down anyway)."""
        for hosts in self.idle.values():
            for h in hosts:
                if kill:
                    self._drop(h)
        self.idle.clear()
        self.hosts.clear()
        self.uses.clear()


def thread_limit(threads: int) -> int:
    """A pooled process's limit of calls at once: the run's need rounded up to a power of two, at
    least MIN_THREADS, so that runs of different strategies and sizes share processes. A higher
    limit only lets a call start that would have queued: every worker and server of this package
    is a threaded actor already (limit >= 2), and none relies on a call queueing."""
    return max(MIN_THREADS, 1 << max(0, threads - 1).bit_length())


_installed: ProcessPool | None = None


def install(pool: ProcessPool | None) -> None:
    """Make `pool` the one this driver's runs use where it admits them (None: fresh processes)."""
    global _installed
    if _installed is not None and _installed is not pool:
        _installed.clear()
    _installed = pool


def installed() -> ProcessPool | None:
    return _installed


def forget() -> None:
    """Ray is stopping: every pooled process goes with it (the pool stays installed, empty)."""
    if _installed is not None:
        _installed.clear(kill=False)
