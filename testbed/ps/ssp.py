"""Stale-synchronous parallel (SSP): the start rule and the staleness it allows. Pure."""

from __future__ import annotations


def ssp_staleness_bound(workers: int, bound: int) -> int:
    """Largest version staleness SSP with clock bound s allows: (N-1)(2s+1).

    While worker w computes iteration c (pulled after every worker finished c-s-1), any other
    worker j can push iterations c-s .. c+s (it may not start c+s+1 before w finishes c): at
    most 2s+1 gradients each, all applied between w's pull and w's push. The clock bound s
    is in iterations; in versions (the staleness we record) it scales with N.
    """
    return (workers - 1) * (2 * bound + 1)


def ssp_may_start(iteration: int, completed: list[int], bound: int | None) -> bool:
    """SSP rule: iteration c may start once every worker has finished iteration c-s-1.

    `completed[j]` counts worker j's finished iterations, so "finished c-s-1" is
    completed[j] >= c-s. No bound (None) means fully asynchronous.
    """
    return bound is None or min(completed) >= iteration - bound
