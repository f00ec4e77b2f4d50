"""Helpers every strategy uses to talk to its actors: timed waits, spawning, killing.

Every wait on a remote call has a timeout; a hang becomes `RemoteTimeout`, never a stuck run.
"""

from __future__ import annotations

from typing import Any

import ray


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


def spawn(actor_cls: Any, cluster: Any, count: int, *args: Any, server: bool = False,
          concurrency: int = 1, **kwargs: Any) -> list[Any]:
    """Create `count` actors of a Ray actor class in the run's placement group.

    Positional args after `count` go to every constructor; the actor index is passed as the
    keyword `rank`, its CPU share as `cpus`.
    """
    handles = []
    for i in range(count):
        opts = cluster.options(i, server=server)
        extra = {"cpus": opts["num_cpus"]} if not server else {}
        handles.append(actor_cls.options(max_concurrency=concurrency, **opts)
                       .remote(*args, rank=i, **extra, **kwargs))
    return handles


def kill_all(handles: list[Any]) -> None:
    for h in handles:
        try:
            ray.kill(h, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead is fine
            pass
    handles.clear()
