"""Several logical workers in one actor process (`--workers-per-process K`).

Why: every worker actor is a Python process, and on 2 cores a process costs about 0.5 s of
start-up and 90-100 MiB of memory (N = 64 took 32 s to start and 6 GiB; a ring of 128
processes 78 s, 11.6 GiB, and 146x its model per step). Where workers talk by actor calls (the parameter server's push and
pull, the MapReduce driver's map call) or by links that can be made in memory (the ring's
neighbours: `channels.Slot`), nothing about them needs a process of their own: K of them can
share one, each still its own object with its own data shard, optimizer state, straggler model
and emulated NIC, so every message still passes through the emulated network as before.

    driver / other actors                 one host process (Ray actor, K * c threads)
    members[r].iteration.remote(...)  ->  Host.invoke(r, "iteration", ...)  ->  worker r
    members[r+1].iteration.remote(..) ->  Host.invoke(r+1, "iteration", ..) ->  worker r+1

A `Member` stands where an actor handle stood: `member.method.remote(*args)` is an ordinary
Ray call of the host's `invoke`, whose reference the caller waits on, gets or passes to
`ray.wait` as before. The host runs up to K * c calls at once (c: the concurrency one worker
had), so the K workers' iterations overlap as K processes' would; their emulated waits are
sleeps, which release the interpreter lock.

What sharing a process changes, and so where it is refused (testbed.config.validate): real
compute would take turns on one interpreter lock (synthetic compute is a sleep); an injected
kill or hang would take all K workers down; torch.distributed and gossip's links have one end
per process. Which strategies can host
several workers is theirs to say (`StrategySpec.cannot_share_processes`).
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Iterable
from typing import Any


class StaleCall(RuntimeError):
    """A call addressed to a worker of an earlier run of a reused process (testbed.runtime.pool)."""


class Host:
    """K logical workers of one class, built in this process, called by rank.

    Built with a class and ranks, it holds them for its life (a Ray restart builds them again).
    Built empty, it is a reusable process (testbed.runtime.pool): `load` builds one run's
    workers under a new epoch, `unload` drops them; a call carries the epoch of the run that
    addressed it, so a late call of an earlier run can never reach a later run's worker.
    """

    def __init__(self, worker_cls: type | None = None, ranks: Iterable[int] = (), *args: Any,
                 cpus: float = 1.0, **kwargs: Any) -> None:
        self.epoch = 0
        self.members: dict[int, Any] = {}
        self.active = 0  # calls running now (unload reuses the process only when none is)
        self.lock = threading.Lock()
        if worker_cls is not None:
            self.members = {r: worker_cls(*args, rank=r, cpus=cpus, **kwargs) for r in ranks}

    def invoke(self, address: tuple[int, int], method: str, *args: Any, **kwargs: Any) -> Any:
        epoch, rank = address
        with self.lock:  # (checked and counted at once: `unload` sees every call it lets in)
            if epoch != self.epoch:
                raise StaleCall(f"a call of run epoch {epoch} reached this process in epoch {self.epoch}")
            self.active += 1
        try:
            return getattr(self.members[rank], method)(*args, **kwargs)
        finally:
            with self.lock:
                self.active -= 1

    def load(self, epoch: int, worker_cls: type, ranks: list[int], args: tuple, kwargs: dict[str, Any],
             cpus: float | None) -> int:
        """Build one run's workers (a server: cpus None) in this (reused) process; its pid."""
        share = {} if cpus is None else {"cpus": cpus}
        self.members = {r: worker_cls(*args, rank=r, **share, **kwargs) for r in ranks}
        self.epoch = epoch
        return os.getpid()

    def unload(self, grace_s: float = 0.5) -> bool:
        """Drop the run's workers (each one's `release`, where it has one, first). True when the
        process is fit for another run: no call of this run still running after `grace_s`."""
        with self.lock:
            self.epoch = -1  # from here on every call of the run is refused
        deadline = time.monotonic() + grace_s
        while self.active and time.monotonic() < deadline:
            time.sleep(0.01)
        idle = self.active == 0
        for member in self.members.values():
            release = getattr(member, "release", None)
            if release is not None:
                try:
                    release()
                except Exception:  # noqa: BLE001 - a worker that cannot release: not reused
                    idle = False
        self.members = {}
        gc.collect()
        return idle


class _Call:
    __slots__ = ("address", "host", "method")

    def __init__(self, host: Any, address: tuple[int, int], method: str) -> None:
        self.host, self.address, self.method = host, address, method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.host.invoke.remote(self.address, self.method, *args, **kwargs)


class Member:
    """One logical worker's handle: `member.method.remote(...)` as on an actor handle."""

    def __init__(self, host: Any, rank: int, epoch: int = 0) -> None:
        self.host, self.rank, self.epoch = host, rank, epoch

    def __getattr__(self, name: str) -> _Call:
        if name.startswith("__") or name in ("host", "rank", "epoch"):  # (pickle, copy: not a remote method)
            raise AttributeError(name)
        return _Call(self.host, (self.epoch, self.rank), name)

    def __repr__(self) -> str:
        return f"Member(rank={self.rank})"


def process_of(handle: Any) -> Any:
    """The actor handle of the process a handle's worker lives in (itself for a plain actor)."""
    return handle.host if isinstance(handle, Member) else handle


def same_process(a: Any, b: Any) -> bool:
    """Whether two handles' workers live in one process (two members of one host)."""
    return isinstance(a, Member) and isinstance(b, Member) and a.host is b.host


def groups(count: int, per_process: int) -> list[list[int]]:
    """Ranks 0..count-1 in consecutive groups of `per_process` (the last may be smaller)."""
    return [list(range(lo, min(count, lo + per_process))) for lo in range(0, count, per_process)]
