"""ps-sync's emulated peers without Ray: their NICs (testbed.emulation.peers.SegmentNics) and the copies a server
counts for them (ShardState)."""

import numpy as np
import pytest

from testbed.emulation.network import LinkSpec
from testbed.emulation.peers import SegmentNics
from testbed.ps.shard import ShardState
from testbed.training.optim import OptimizerSpec, mean_gradient

LINK = LinkSpec(bandwidth=1e9, latency=1e-4)  # 1 GB/s: 1e6 bytes take 1 ms


def test_each_peer_receives_on_its_own_ingress_in_departure_order():
    """Two partitions of 1 MB; peer 0's leave their servers together, peer 1's 5 ms apart with the
    later one first in the list: peer 0's second waits for its first on the one ingress, peer 1's
    do not meet, and neither peer delays the other."""
    nics = SegmentNics(LINK, 2)
    ready = nics.receive([1_000_000, 1_000_000], [[0.0, 0.005], [0.0, 0.0]])
    a, t = LINK.latency, 1e-3
    assert ready[0] == pytest.approx(a + 2 * t)  # the second behind the first
    assert ready[1] == pytest.approx(0.005 + a + t)  # the later one, alone on the link
    again = nics.receive([1_000_000], [[1.0, 1.0]])  # idle queues again: nothing carried over
    np.testing.assert_allclose(again, 1.0 + a + t)


def test_each_peer_sends_its_partitions_back_to_back_from_when_its_gradient_is_ready():
    nics = SegmentNics(LINK, 2)
    out = nics.send([1_000_000, 2_000_000, 1_000_000], [0.0, 0.010])
    np.testing.assert_allclose(out, [[0.0, 0.010], [0.001, 0.011], [0.003, 0.013]])


def test_a_push_with_copies_counts_once_per_position_and_averages_in_position_order():
    """Five positions, real workers 0 (standing for 0-2) and 3 (for 3-4): the version completes
    with the second push only, equals the mean of the five gradients in position order to the
    bit, and its replies go to every position in delivery order."""
    rng = np.random.default_rng(0)
    g0, g3 = rng.standard_normal(7).astype(np.float32), rng.standard_normal(7).astype(np.float32)
    s = ShardState(np.zeros(7, np.float32), optimizer=OptimizerSpec(lr=1.0), sync=True, workers=5)
    first = s.push(g3, 0, worker=3, iteration=0, loss=3.0, delivered=1.0, copies=[(1.5, 4)])
    assert s.version == 0 and "contributors" not in first
    ack = s.push(g0, 0, worker=0, iteration=0, loss=0.0, delivered=2.0, copies=[(0.5, 1), (3.0, 2)])
    assert s.version == 1
    np.testing.assert_array_equal(s.params, -mean_gradient([g0, g0, g0, g3, g3]))
    assert ack["contributors"] == [1, 3, 4, 0, 2]
    assert ack["update"]["contributors"] == 5 and ack["update"]["loss"] == pytest.approx(1.2)


def test_a_retried_push_with_copies_counts_nothing_again():
    s = ShardState(np.zeros(1, np.float32), optimizer=OptimizerSpec(lr=1.0), sync=True, workers=3)
    s.push(np.ones(1, np.float32), 0, worker=0, iteration=0, loss=0.0, copies=[(0.0, 1)])
    again = s.push(np.ones(1, np.float32), 0, worker=0, iteration=0, loss=0.0, copies=[(0.0, 1)])
    assert again["status"] == "duplicate" and len(s.pending) == 2 and s.version == 0
