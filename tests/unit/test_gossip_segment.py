"""Gossip with emulated peers: each edge's model travels once, inside a segment or in the one
message per pair of real workers, and K = N is one message per neighbour (testbed.gossip.segment)."""

import pytest

from testbed.gossip.segment import Segment, most_senders
from testbed.gossip.topology import TOPOLOGIES, neighbours


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize(("n", "k"), [(8, 2), (10, 3), (16, 16), (5, 1)])
def test_every_directed_edge_travels_exactly_once(topology, n, k):
    segs = [Segment(topology, n, k, r) for r in range(k)]
    assert [p for s in segs for p in s.positions] == list(range(n))
    edges = []
    for s in segs:
        edges += s.local
        for r, pairs in s.outgoing.items():
            assert r != s.index
            assert all(p in s.positions and p not in segs[r].positions and j in segs[r].positions
                       for p, j in pairs)
            edges += pairs
    nbrs = neighbours(topology, n)
    assert sorted(edges) == sorted((p, j) for p in range(n) for j in nbrs[p])
    for s in segs:  # whoever a segment sends to sends back, and it waits for exactly those
        assert s.senders == sorted(r for r, o in enumerate(segs) if s.index in o.outgoing)
        assert s.inbound() == sum(len(nbrs[p]) for p in s.positions)


def test_ring_of_eight_in_two_segments_crosses_at_the_two_boundaries():
    s0, s1 = Segment("ring", 8, 2, 0), Segment("ring", 8, 2, 1)
    assert s0.outgoing == {1: [(0, 7), (3, 4)]} and s1.outgoing == {0: [(4, 3), (7, 0)]}
    assert (1, 2) in s0.local and (2, 1) in s0.local
    assert most_senders("ring", 8, 2) == 1


def test_all_real_sends_one_message_per_neighbour():
    for r in range(8):
        s = Segment("exponential", 8, 8, r)
        assert not s.local and s.senders == sorted(s.nbrs[r])
        assert all(pairs == [(r, j)] for j, pairs in s.outgoing.items())
    assert most_senders("exponential", 8, 8) == 5 == len(neighbours("exponential", 8)[0])
