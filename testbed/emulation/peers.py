r"""Real workers and emulated peers (`--real-workers K` of `--workers N`): who is which. Pure.

A run of N workers may start only K of them as processes; the other N-K are *emulated peers*,
played by the real workers. Real worker r sits at position q_r = floor(r N / K), so the real
ones are spread evenly, and the positions after it up to the next real one are its *segment*:

    position   0   1   2   3   4   5   6   7   8   9        N = 10, K = 3
               R0  e   e   R1  e   e   R2  e   e   e       R = real, e = emulated
               \__ R0 __/  \__ R1 __/  \____ R2 ____/      segments of 2, 2 and 3 peers

What an emulated peer is, for every strategy that has them:
- its gradient is a copy of its segment owner's (the real worker before it), so a step's mean
  gradient is sum_r (m_r + 1) g_r / N, m_r the peers of r's segment -- with N a multiple of K
  that is the mean of the real workers' gradients, exactly checkable
  (testbed.workloads.reference);
- its batch is as large as its owner's, so it counts in samples/s (`weights`);
- its compute ends when its owner's does, plus its own straggler delay beyond the owner's (an
  emulated peer is never earlier than its owner: its gradient does not exist before the owner's);
- its messages follow the emulator's NIC model at the model's times (the strategy's package
  says how: testbed.allreduce.relay for the ring, `SegmentNics` below where a peer talks to a
  server or the driver: testbed.ps.worker, testbed.mapreduce.driver; testbed.gossip.segment,
  where it keeps a replica of its own), and it has no records of its own: the summary's
  `real_workers` says how many workers have them.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from testbed.emulation.network import LinkSpec, Nic

__all__ = ["SegmentNics", "owner", "real_positions", "segment_sizes", "weights"]


def _check(n: int, k: int) -> None:
    if not 1 <= k <= n:
        raise ValueError(f"real workers {k} of {n}: must be between 1 and {n}")


def real_positions(n: int, k: int) -> list[int]:
    """The ring positions (worker ids) of the K real workers of N: r N // K."""
    _check(n, k)
    return [r * n // k for r in range(k)]


def segment_sizes(n: int, k: int) -> list[int]:
    """The emulated peers after each real worker, up to the next one (its segment)."""
    q = [*real_positions(n, k), n]
    return [q[r + 1] - q[r] - 1 for r in range(k)]


def weights(n: int, k: int) -> dict[int, int]:
    """Position of each real worker -> the workers it stands for (itself and its segment)."""
    return {q: m + 1 for q, m in zip(real_positions(n, k), segment_sizes(n, k), strict=True)}


def owner(n: int, k: int, x: int) -> int:
    """The position of the real worker whose segment holds position x (x itself if real)."""
    if not 0 <= x < n:
        raise ValueError(f"position {x}: must be in [0, {n})")
    q = real_positions(n, k)
    return q[bisect.bisect_right(q, x) - 1]


class SegmentNics:
    """The NICs of a real worker's m emulated peers, in the real worker's process, for strategies
    whose workers talk to a real server or driver (ps-sync, mapreduce):

        server or driver                               real worker q, its peers q+1 .. q+m
          sends each position its message ----------->  q: its own, real
                               departures ----------->  receive: each peer's ingress -> when
                                                        peer j holds every part (ready_j)
                                                        q computes; peer j's gradient is ready at
                                                        ready_j + q's compute + its straggler extra
          Endpoint.deliveries: q's message and <------  send: each peer's egress, parts back to
          each copy on the ingress                      back, as q's own; q's message carries
                                                        their departures

    What the peers send is computed, not timed: the server or driver queues every copy on its
    own (real) NIC, so the incast there is that of N workers.
    """

    def __init__(self, link: LinkSpec, m: int) -> None:
        self.nics = [Nic(link, f"peer{j}") for j in range(m)]

    @property
    def m(self) -> int:
        return len(self.nics)

    def receive(self, nbytes: Sequence[int], departures: Sequence[Sequence[float]]) -> np.ndarray:
        """`departures[p][j]`: when part p (`nbytes[p]` bytes) left its sender for peer j. Each
        peer's ingress takes them in departure order; return when peer j holds them all."""
        ready = np.full(self.m, -np.inf)
        for j, nic in enumerate(self.nics):
            for p in sorted(range(len(nbytes)), key=lambda p: departures[p][j]):
                ready[j] = max(ready[j], nic.reserve_ingress(nbytes[p], departures[p][j]))
        return ready

    def send(self, nbytes: Sequence[int], at: Sequence[float]) -> list[list[float]]:
        """Peer j's parts leave back to back on its egress from `at[j]`, when its gradient is
        ready; return `departures[p][j]`."""
        out = [[0.0] * self.m for _ in nbytes]
        for j, nic in enumerate(self.nics):
            for p, n in enumerate(nbytes):
                out[p][j] = nic.reserve_egress(n, at[j])[0]
        return out
