"""The emulated peers of a ps-sync worker (`--real-workers K < N`, testbed.emulation.peers). Pure.

A real worker at position q plays the m positions after it. Every emulated peer has a NIC of its
own (one `Nic` here, in the real worker's process) and pushes a copy of q's gradient; the servers
are real, so their NICs queue every peer's push and reply, and the incast at a server is the
incast of N workers:

    server s (partition p)                          real worker q, its peers q+1 .. q+m
      the version completes: a reply per position,
      in delivery order, on s's egress ------------> q: its own reply (real)
                                   departures ------> receive: each peer's ingress -> when peer j
                                                      holds every partition (ready_j)
                                                      q computes; peer j's gradient is ready at
                                                      ready_j + q's compute + its straggler extra
      push(p, g[p], peers = departures) <-----------  send: each peer's egress, partitions back to
      s's ingress queues q's push and each copy,      back, as q's own
      in departure order; the version counts m + 1

The version's mean sums N gradients in position order (ShardState), q's once per position it
stands for, so the run equals one process stepping the owner-weighted mean
(testbed.workloads.reference). What the emulated peers send is computed, not timed: a real
worker's push carries its peers' departures, and the server reserves its ingress for each.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from testbed.emulation.network import LinkSpec, Nic

__all__ = ["SegmentNics"]


class SegmentNics:
    """The NICs of a real worker's m emulated peers."""

    def __init__(self, link: LinkSpec, m: int) -> None:
        self.nics = [Nic(link, f"peer{j}") for j in range(m)]

    @property
    def m(self) -> int:
        return len(self.nics)

    def receive(self, nbytes: Sequence[int], departures: Sequence[Sequence[float]]) -> np.ndarray:
        """`departures[p][j]`: when partition p (`nbytes[p]` bytes) left its server for peer j.
        Each peer's ingress takes them in departure order; return when peer j holds them all."""
        ready = np.full(self.m, -np.inf)
        for j, nic in enumerate(self.nics):
            for p in sorted(range(len(nbytes)), key=lambda p: departures[p][j]):
                ready[j] = max(ready[j], nic.reserve_ingress(nbytes[p], departures[p][j]))
        return ready

    def send(self, nbytes: Sequence[int], at: Sequence[float]) -> list[list[float]]:
        """Peer j's partitions leave back to back on its egress from `at[j]`, when its gradient
        is ready; return `departures[p][j]`."""
        out = [[0.0] * self.m for _ in nbytes]
        for j, nic in enumerate(self.nics):
            for p, n in enumerate(nbytes):
                out[p][j] = nic.reserve_egress(n, at[j])[0]
        return out
