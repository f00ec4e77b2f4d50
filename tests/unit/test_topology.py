"""Gossip graphs, mixing matrices, consensus, the gossip cost model and the gossip flags."""

import numpy as np
import pytest

from testbed.analysis.costmodel import gossip_async_comm_s
from testbed.config import ConfigError, RunConfig, validate, with_overrides
from testbed.emulation.network import LinkSpec, simulate
from testbed.gossip.config import GossipConfig
from testbed.gossip.topology import (
    TOPOLOGIES,
    consensus_distance,
    degree,
    mix,
    mixing_matrix,
    mixing_row,
    neighbours,
    pairwise_partner,
    spectral_gap,
    torus_shape,
)
from testbed.strategies.registry import SPECS

K, A, B = 1e6, 1e-3, 1e9


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("n", range(1, 13))
def test_graph_is_symmetric_and_w_doubly_stochastic(topology, n):
    nbrs = neighbours(topology, n)
    for i, mine in enumerate(nbrs):
        assert i not in mine and len(set(mine)) == len(mine)
        assert all(i in nbrs[j] for j in mine)  # undirected
    w = mixing_matrix(nbrs)
    np.testing.assert_allclose(w, w.T)
    np.testing.assert_allclose(w.sum(axis=0), 1.0)
    np.testing.assert_allclose(w.sum(axis=1), 1.0)
    assert (w >= 0).all()
    if n > 1:
        assert spectral_gap(w) > 0  # connected: consensus is reached


@pytest.mark.parametrize(("topology", "n", "expected"), [
    ("ring", 1, 0), ("ring", 2, 1), ("ring", 8, 2),
    ("torus", 8, 3), ("torus", 9, 4), ("torus", 16, 4), ("torus", 7, 2),
    ("exponential", 8, 5), ("exponential", 16, 7),
    ("complete", 8, 7), ("complete", 1, 0),
])
def test_degree_literal(topology, n, expected):
    assert degree(topology, n) == expected


def test_literal_neighbours_and_torus_shape():
    assert neighbours("ring", 5)[0] == [1, 4]  # send order: offset +1 first
    assert neighbours("exponential", 8)[0] == [1, 2, 4, 6, 7]
    assert torus_shape(12) == (3, 4) and torus_shape(7) == (1, 7)
    assert sorted(neighbours("torus", 9)[4]) == [1, 3, 5, 7]


def test_complete_graph_mixes_to_the_exact_average():
    w = mixing_matrix(neighbours("complete", 5))
    np.testing.assert_allclose(w, np.full((5, 5), 0.2))
    x = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    out = [mix(mixing_row(i, neighbours("complete", 5)), dict(enumerate(x))) for i in range(5)]
    for o in out:
        np.testing.assert_allclose(o, x.mean(axis=0), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(o, out[0])  # same sum order on every worker
    assert consensus_distance(out) == 0.0


def test_ring_consensus_distance_shrinks_by_lambda2_per_round():
    n = 8
    w = mixing_matrix(neighbours("ring", n))
    x = np.random.default_rng(1).standard_normal((n, 50))
    dist = [consensus_distance(x)]
    for _ in range(20):
        x = w @ x
        dist.append(consensus_distance(x))
    assert all(b < a for a, b in zip(dist, dist[1:], strict=False))
    assert dist[-1] < dist[0] * (1 - spectral_gap(w)) ** 20 * 3  # geometric at rate |lambda_2|
    np.testing.assert_allclose(x.mean(axis=0), x[0], atol=dist[-1] * 2)


def test_consensus_distance_literal():
    assert consensus_distance([np.array([0.0, 0.0]), np.array([2.0, 0.0])]) == pytest.approx(1.0)


def test_pairwise_partner_is_a_seeded_neighbour():
    nbrs = neighbours("torus", 9)
    picks = [pairwise_partner(4, nbrs, 0, it) for it in range(50)]
    assert set(picks) == set(nbrs[4])
    assert picks == [pairwise_partner(4, nbrs, 0, it) for it in range(50)]
    assert pairwise_partner(0, neighbours("ring", 1), 0, 0) is None


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("n", [2, 3, 5, 8, 9, 12])
def test_send_order_meets_the_cost_model_on_the_nic_emulator(topology, n):
    """Every worker sends its model to its d neighbours at once: the last lands at a + d K/B."""
    nbrs = neighbours(topology, n)
    messages = [(i, j, K, 0.0) for i in range(n) for j in nbrs[i]]
    last = max(simulate(messages, LinkSpec(bandwidth=B, latency=A)))
    assert last == pytest.approx(_predict(n, **{"gossip.topology": topology}))


def _predict(n, **changes):
    cfg = _cfg(strategy="gossip", workers=n, **changes)
    return SPECS["gossip"].predict(cfg, {"grad_bytes_logical": K}, A, B).comm_s


def test_gossip_predictions_async_and_fp16():
    assert degree("torus", 9) == 4
    assert _predict(9, **{"gossip.topology": "torus"}) == pytest.approx(A + 4 * K / B)
    half = _predict(9, **{"gossip.topology": "torus", "compression": "fp16"})
    assert half == pytest.approx(A + 2 * K / B)
    asy = _predict(8, **{"gossip.asynchronous": True})
    assert asy == pytest.approx(gossip_async_comm_s(K, A, B)) == pytest.approx(2 * (A + K / B))
    assert _predict(1, **{"gossip.asynchronous": True}) == 0.0


# ---------------------------------------------------------------- flags


def _cfg(**changes):
    return validate(with_overrides(RunConfig(), **changes), SPECS)


def test_gossip_flags_validate():
    cfg = _cfg(strategy="gossip", **{"gossip.topology": "torus", "gossip.asynchronous": True})
    assert cfg.gossip == GossipConfig(topology="torus", asynchronous=True)


@pytest.mark.parametrize(("changes", "needle"), [
    ({"strategy": "gossip", "gossip.topology": "star"}, "--topology 'star': choose one of ring, torus"),
    ({"strategy": "ring", "gossip.topology": "torus"}, "--topology 'torus': applies to --strategy gossip only"),
    ({"strategy": "ps-sync", "gossip.asynchronous": True}, "--gossip-async True: applies to --strategy gossip"),
    ({"strategy": "gossip", "ring.algorithm": "tree"}, "--algorithm 'tree': applies to --strategy ring"),
    ({"strategy": "gossip", "compression": "topk:0.1"}, "gossip averages parameters"),
])
def test_gossip_flags_rejected_with_one_line(changes, needle):
    with pytest.raises(ConfigError) as info:
        _cfg(**changes)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_cli_parses_gossip_flags():
    from testbed.config import parse_config

    cfg = parse_config(["--strategy", "gossip", "--workers", "8", "--topology", "exponential",
                        "--gossip-async", "--compression", "fp16"], SPECS)
    assert cfg.gossip == GossipConfig("exponential", True) and str(cfg.compression) == "fp16"
