"""Helpers every strategy uses to talk to its actors: timed waits, spawning, broadcasting,
killing, collecting timeline spans, and telling a restarted actor from a healthy one.

Every wait on a remote call has a timeout; a hang becomes `RemoteTimeout`, never a stuck run.
"""

from __future__ import annotations

import functools
import re
import time
from typing import Any

import ray

from testbed.emulation.faults import RestartsExhausted
from testbed.runtime import hosting, pool

STARTUP_S = 180.0  # an actor's start-up (process + imports) on a loaded 2-core machine


def startup_timeout(timeout: float) -> float:
    """Start-up and restart waits get at least STARTUP_S: importing torch can take a while."""
    return max(timeout, STARTUP_S)


class RemoteTimeout(RuntimeError):
    """A remote call did not answer within --timeout."""


def get(refs: Any, timeout: float, what: str) -> Any:
    """ray.get with a timeout whose error says what was being waited for."""
    try:
        return ray.get(refs, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise RemoteTimeout(
            f"{what} did not answer within {timeout:g}s; a worker may be hung (raise --timeout if the "
            "machine is just slow)"
        ) from None


def get_each(refs: list[Any], timeout: float, what: str) -> list[Any]:
    """Each ref's value, None where its actor is dead or unreachable (a node lost after the run's
    last update): for what a finished run gathers from its actors, which must not fail the run."""
    out = []
    for ref in refs:
        try:
            out.append(get(ref, timeout, what))
        except (ray.exceptions.RayActorError, RemoteTimeout):
            out.append(None)
    return out


def root_cause(exc: BaseException) -> BaseException:
    """The exception an actor raised, under Ray's wrappers (a RayTaskError's cause, recursively:
    an actor that calls another actor wraps that one's error again)."""
    while getattr(exc, "cause", None) is not None and exc.cause is not exc:
        exc = exc.cause
    return exc


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def describe(exc: BaseException) -> str:
    """One line for an error, whatever wraps it: the actor's own exception (Ray's wrappers and
    colour codes removed) and, for an actor task, which method raised it."""
    root = root_cause(exc)
    text = ANSI.sub("", str(root)).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if isinstance(root, ray.exceptions.RayTaskError) or (lines and lines[0].startswith("ray::")):
        where = lines[0].split("(", 1)[0].removeprefix("ray::") if lines else "an actor"
        last = next((ln for ln in reversed(lines) if not ln.startswith(("File ", "^", "ray::"))), "")
        return f"{type(root).__name__} in {where}: {last}"[:400]
    first = lines[0] if lines else ""
    return f"{type(root).__name__}: {first}"[:400] if first else type(root).__name__


@functools.cache
def _actor_class(cls: type) -> Any:
    return ray.remote(cls)


def spawn(worker_cls: type, cluster: Any, count: int, config: Any, *args: Any, server: bool = False,
          concurrency: int = 1, max_restarts: int = 0, **kwargs: Any) -> list[Any]:
    """Create `count` actors of a class in the run's placement group; return a handle per rank.

    `config` (the RunConfig) and the positional args after it go to every constructor; the
    actor index is passed as the keyword `rank`, its CPU share as `cpus`. Failed calls are never
    retried by Ray: the strategy redoes the work itself, so that nothing is applied twice. Where
    the cluster hosts several workers per process (`cluster.per_process` > 1,
    testbed.runtime.hosting) each process is a `Host` of consecutive ranks, and the handles are
    its `Member`s; so they are where a driver's process pool hosts the run (testbed.runtime.pool).
    """
    per_process = 1 if server else getattr(cluster, "per_process", 1)
    warm = None if server else _pool_for(cluster, config)
    if warm is not None:
        return _lend(warm, worker_cls, cluster, hosting.groups(count, per_process), (config, *args), kwargs,
                     concurrency * per_process + 1)
    if per_process == 1:
        handles = []
        for i in range(count):
            opts = cluster.options(i, server=server)
            extra = {"cpus": opts["num_cpus"]} if not server else {}
            handles.append(_actor_class(worker_cls).options(max_concurrency=concurrency, max_restarts=max_restarts,
                                                            max_task_retries=0, **opts)
                           .remote(config, *args, rank=i, **extra, **kwargs))
        return handles
    members = []
    for ranks in hosting.groups(count, per_process):
        opts = cluster.options(ranks[0])
        host = (_actor_class(hosting.Host)
                .options(max_concurrency=concurrency * len(ranks) + 1, max_restarts=max_restarts,
                         max_task_retries=0, **opts)
                .remote(worker_cls, ranks, config, *args, cpus=opts["num_cpus"] / len(ranks), **kwargs))
        members += [hosting.Member(host, r) for r in ranks]
    return members


def spawn_server(server_cls: type, cluster: Any, index: int, config: Any, *args: Any, concurrency: int = 1,
                 max_restarts: int = 0, **kwargs: Any) -> Any:
    """Create server `index` of the run (its own constructor args; `config` only decides whether
    a driver's process pool may host it); the keyword `rank` is its index."""
    warm = _pool_for(cluster, config)
    if warm is not None:
        (member,) = _lend(warm, server_cls, cluster, [[index]], args, kwargs, concurrency + 1, server=True)
        return member
    return (_actor_class(server_cls)
            .options(max_concurrency=concurrency, max_restarts=max_restarts, max_task_retries=0,
                     **cluster.options(index, server=True))
            .remote(*args, rank=index, **kwargs))


def _pool_for(cluster: Any, config: Any) -> Any:
    """The driver's process pool where one is installed and admits this run, else None."""
    warm = pool.installed()
    return warm if warm is not None and warm.admits(cluster, config) is None else None


def _lend(warm: Any, worker_cls: type, cluster: Any, groups: list[list[int]], args: tuple,
          kwargs: dict[str, Any], threads: int, server: bool = False) -> list[Any]:
    """The run's workers (or a server), one group of ranks per process of the pool, each loaded
    before the first call (a threaded actor does not keep the order of calls)."""
    hosts, epoch = warm.take(_actor_class(hosting.Host), threads, len(groups))
    cpus = [None if server else cluster.options(g[0])["num_cpus"] / len(g) for g in groups]
    loads = [h.load.remote(epoch, worker_cls, g, args, kwargs, c)
             for h, g, c in zip(hosts, groups, cpus, strict=True)]
    try:
        get(loads, startup_timeout(cluster.cfg.timeout_s), "worker start-up")
    except BaseException:
        warm.give_back(hosts)
        raise
    return [hosting.Member(h, r, epoch) for h, g in zip(hosts, groups, strict=True) for r in g]


def kill(handle: Any, no_restart: bool = True) -> None:
    """Kill the process a handle's actor (or logical worker) lives in."""
    ray.kill(hosting.process_of(handle), no_restart=no_restart)


def kill_all(handles: list[Any]) -> None:
    """End a run's actors: kill their processes, or give them back to the pool they came from."""
    procs = list({id(p): p for p in map(hosting.process_of, handles)}.values())
    warm = pool.installed()
    lent = [p for p in procs if warm is not None and warm.lent(p)]
    if lent:
        warm.give_back(lent)
    for h in procs:
        if h in lent:
            continue
        try:
            ray.kill(h, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead is fine
            pass
    handles.clear()


ACTOR_ERRORS = (ray.exceptions.RayActorError, RemoteTimeout)


class Liveness:
    """Tracks a group of actors' process ids to tell a restarted actor from a healthy one.

    After a failure, `revive()` pings everyone: an actor that does not answer within the
    timeout is hung and is killed so that Ray restarts it; one whose pid changed was
    restarted; one that is dead for good (restarts exhausted) raises RestartsExhausted.
    """

    def __init__(self, handles: list[Any], timeout: float, what: str) -> None:
        self.handles, self.timeout, self.what = handles, timeout, what
        self.pids = get([h.ping.remote() for h in handles], startup_timeout(timeout), f"{what} start-up")
        self.restarts = [0] * len(handles)

    def revive(self) -> list[int]:
        """Bring every dead or hung actor back; return the indices that were restarted."""
        revived = self.find_dead()
        for i in revived:
            self.wait_alive(i)
        return revived

    def alive(self, i: int, pid: int) -> None:
        """Actor i answered again after a restart, from process `pid`."""
        self.pids[i] = pid
        self.restarts[i] += 1

    def find_dead(self) -> list[int]:
        """Indices of actors that died (now restarting) or hang (killed here, so Ray restarts them)."""
        pings = [h.ping.remote() for h in self.handles]
        ready, _ = ray.wait(pings, num_returns=len(pings), timeout=min(self.timeout, 10.0))
        revived = []
        for i, ref in enumerate(pings):
            if ref not in ready:  # hung: a hang is treated as a death
                kill(self.handles[i], no_restart=False)
                revived.append(i)
                continue
            try:
                pid = ray.get(ref)
            except ray.exceptions.ActorDiedError:
                raise self._exhausted(i) from None
            except ray.exceptions.RayActorError:
                revived.append(i)
                continue
            if pid != self.pids[i]:
                revived.append(i)
        return revived

    def ping(self, i: int) -> Any:
        """Start asking actor i whether it is back; pass the ref to `answered` once it is ready."""
        return self.handles[i].ping.remote()

    def answered(self, i: int, ref: Any, timeout: float = 0.0) -> bool:
        """True if the ping `ref` shows actor i back (its restart is counted); False while it is
        still restarting; RestartsExhausted when it is dead for good."""
        try:
            pid = ray.get(ref, timeout=timeout)
        except ray.exceptions.ActorDiedError:
            raise self._exhausted(i) from None
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return False
        self.alive(i, pid)
        return True

    def wait_alive(self, i: int) -> None:
        """Block until actor i answers again after a restart."""
        deadline = time.monotonic() + startup_timeout(self.timeout)
        while time.monotonic() < deadline:
            if self.answered(i, self.ping(i), timeout=max(0.1, deadline - time.monotonic())):
                return
            time.sleep(0.1)
        raise RemoteTimeout(f"{self.what} {i} did not come back within {self.timeout:g}s after a restart")

    def _exhausted(self, i: int) -> Exception:
        return RestartsExhausted(f"{self.what} {i} died and has no restarts left (--max-restarts); "
                                 "the run stops")


def broadcast(handles: list[Any], params: Any, timeout: float, what: str = "parameter broadcast") -> None:
    """Give every actor the same parameters: one object in the store, N `set_params` calls."""
    ref = ray.put(params)
    get([h.set_params.remote(ref) for h in handles], timeout, what)


def drain_events(handles: list[Any], timeout: float) -> list[tuple[str, str, float, float]]:
    """Timeline spans the actors recorded since their last report (what reports did not carry)."""
    return [e for rows in get([h.drain_events.remote() for h in handles], timeout, "timeline events")
            for e in rows]
