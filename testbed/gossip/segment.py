r"""What one real gossip worker plays, and where its positions' models go (pure, no Ray).

With emulated peers (`--real-workers K` of N, testbed.emulation.peers) real worker r plays
the positions q_r .. q_r + m_r of the graph: its own and its segment's. Every position keeps a
replica of its own (an emulated peer's replica lives in its owner's process, with its own
optimizer state); a peer's gradient is a copy of its owner's, applied to the peer's replica.
In a synchronous round every position sends its model to each graph neighbour. A model between
two positions of one segment never leaves the process; the models bound for another real
worker's positions travel in one message to that worker per round, each model once however
many of its positions it feeds:

    ring graph, N = 8, K = 2          worker 0 plays 0 1 2 3, worker 1 plays 4 5 6 7
    position  0  1  2  3 | 4  5  6  7
    worker 0 -> worker 1:  x3 (for 4), x0 (for 7)        one message, two models
    worker 1 -> worker 0:  x4 (for 3), x7 (for 0)        one message, two models

Timing stays per position: each position's models leave its own NIC back to back in its
send order, each lands on the receiving position's ingress in departure order
(`GossipPeer.sync_step` does the NIC arithmetic). With K = N every segment is one position
and a worker sends one message per neighbour, as a gossip run of N real workers does.
"""

from __future__ import annotations

from testbed.emulation.peers import real_positions, segment_sizes
from testbed.gossip.topology import mixing_row, neighbours

__all__ = ["Segment", "most_senders"]


class Segment:
    """Real worker `index` of K among N on `topology`: its positions, their neighbours and
    mixing rows, and the real workers its models go to and come from."""

    def __init__(self, topology: str, n: int, k: int, index: int,
                 nbrs: list[list[int]] | None = None) -> None:
        starts = real_positions(n, k)
        self.first = starts[index]
        self.positions = list(range(self.first, self.first + 1 + segment_sizes(n, k)[index]))
        self.nbrs = neighbours(topology, n) if nbrs is None else nbrs
        owner = [0] * n  # position -> index of the real worker that plays it
        for r, (q, m) in enumerate(zip(starts, segment_sizes(n, k), strict=True)):
            owner[q:q + m + 1] = [r] * (m + 1)
        self.index = index
        self.rows = {p: mixing_row(p, self.nbrs) for p in self.positions}
        # sends[p]: p's neighbours in its send order; outgoing[r]: the (from, to) pairs bound for
        # real worker r, in send order; a pair inside the segment is `local`
        self.local: list[tuple[int, int]] = []
        self.outgoing: dict[int, list[tuple[int, int]]] = {}
        for p in self.positions:
            for j in self.nbrs[p]:
                r = owner[j]
                if r == index:
                    self.local.append((p, j))
                else:
                    self.outgoing.setdefault(r, []).append((p, j))
        # the graph is undirected: whoever this segment sends to sends back
        self.senders = sorted(self.outgoing)

    def inbound(self) -> int:
        """How many models this segment's positions receive per round (its sum of degrees)."""
        return sum(len(self.nbrs[p]) for p in self.positions)


def most_senders(topology: str, n: int, k: int) -> int:
    """The most real workers any one real worker hears from per round (its actor's spare
    threads take their messages)."""
    nbrs = neighbours(topology, n)
    return max(len(Segment(topology, n, k, r, nbrs).senders) for r in range(k))
