"""Allreduce schedules (halving-doubling, tree, hierarchical, ring) against the numpy sum, their
byte counts, their cost-model entries (also on the NIC emulator), the table that holds them and
the --algorithm flags."""

import numpy as np
import pytest

from testbed.allreduce.algorithms import (
    ALGORITHMS,
    Algorithm,
    Round,
    Transfer,
    bytes_moved,
    groups_from_nodes,
    groups_of_size,
    reference_allreduce,
    schedule,
    simulate,
)
from testbed.allreduce.ring import bytes_sent_per_rank
from testbed.allreduce.spec import allreduce_comm_s
from testbed.analysis.costmodel import (
    halving_doubling_folded_comm_s,
    hierarchical_comm_s,
    ring_comm_s,
    tree_comm_s,
)
from testbed.config import ConfigError, RunConfig, validate, with_overrides
from testbed.config.validate import owners
from testbed.emulation.network import LinkSpec, Nic
from testbed.strategies.registry import SPECS

K, A, B = 100e6, 1e-3, 1e9


def _partitions(n):
    """Node groupings for hierarchical: one node, singletons, pairs, uneven, Ray-node style."""
    out = [groups_of_size(n, n), groups_of_size(n, 1), groups_of_size(n, 2), groups_of_size(n, 3)]
    out.append(groups_from_nodes([f"node{r % 2}" for r in range(n)]))  # interleaved ranks
    return out


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("n", range(1, 10))
def test_every_algorithm_equals_the_numpy_sum(algorithm, n):
    rng = np.random.default_rng(n)
    for length in (0, 1, max(1, n - 1), n, 3 * n + 2, 257):
        bufs = [rng.standard_normal(length).astype(np.float32) for _ in range(n)]
        expected = np.sum(np.stack(bufs), axis=0)
        for groups in (_partitions(n) if ALGORITHMS[algorithm].needs_groups else [None]):
            out = reference_allreduce(bufs, algorithm, groups)
            for r, res in enumerate(out):
                np.testing.assert_allclose(res, expected, rtol=1e-5, atol=1e-5,
                                           err_msg=f"{algorithm} n={n} L={length} rank {r} {groups}")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_integer_sums_are_exact(algorithm):
    bufs = [np.arange(23, dtype=np.int64) * (r + 1) for r in range(7)]
    for res in reference_allreduce(bufs, algorithm, groups_of_size(7, 3)):
        np.testing.assert_array_equal(res, np.arange(23) * 28)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("n", range(1, 10))
def test_total_bytes_are_2k_n_minus_1(algorithm, n):
    """Every algorithm moves 2(N-1)K in total; sends equal receives overall."""
    length = 8 * 9 * 5  # divisible by every chunk count used here
    scheds = [schedule(algorithm, r, n, length, groups_of_size(n, 3)) for r in range(n)]
    sent = sum(bytes_moved(s, 4)[0] for s in scheds)
    recv = sum(bytes_moved(s, 4)[1] for s in scheds)
    assert sent == recv == 2 * (n - 1) * length * 4
    assert len({len(s) for s in scheds}) == 1  # same number of rounds on every rank


@pytest.mark.parametrize("n", [2, 4, 8])
def test_halving_doubling_power_of_two_is_balanced_and_logarithmic(n):
    length = 64
    for r in range(n):
        rounds = schedule("halving-doubling", r, n, length)
        assert len(rounds) == 2 * (n.bit_length() - 1)
        assert bytes_moved(rounds, 4) == (2 * (n - 1) * length // n * 4,) * 2


def test_halving_doubling_folds_extra_ranks_in_first():
    rounds = schedule("halving-doubling", 5, 6, 40)  # p = 4: rank 5 folds into rank 1
    assert rounds[0] == Round(sends=(Transfer(1, 0, 40),))
    assert rounds[-1] == Round(recvs=(Transfer(1, 0, 40, add=False),))
    assert all(r == Round() for r in rounds[1:-1])
    assert schedule("halving-doubling", 1, 6, 40)[0] == Round(recvs=(Transfer(5, 0, 40),))


def test_tree_literal_n8():
    assert schedule("tree", 1, 8, 10)[0] == Round(sends=(Transfer(0, 0, 10),))
    assert schedule("tree", 0, 8, 10)[2] == Round(recvs=(Transfer(4, 0, 10),))
    assert schedule("tree", 0, 8, 10)[3] == Round(sends=(Transfer(4, 0, 10),))
    assert schedule("tree", 7, 8, 10)[5] == Round(recvs=(Transfer(6, 0, 10, add=False),))
    assert len(schedule("tree", 0, 9, 10)) == 8  # 2 ceil(log2 9)


def test_ring_schedule_matches_ring_py_bytes():
    for n in range(1, 10):
        for length in (0, 5, 37):
            for r in range(n):
                assert bytes_moved(schedule("ring", r, n, length), 4)[0] == bytes_sent_per_rank(length, n, 4, r)


def test_hierarchical_only_leaders_cross_nodes():
    groups = groups_of_size(8, 4)
    for r in range(8):
        peers = {t.peer for rnd in schedule("hierarchical", r, 8, 16, groups) for t in rnd.sends + rnd.recvs}
        if r not in (0, 4):
            assert peers <= set(groups[r // 4])


def test_simulate_rejects_a_broken_schedule():
    good = [schedule("tree", r, 2, 4) for r in range(2)]
    bad = [good[0], [Round(recvs=(Transfer(0, 0, 3),)), good[1][1]]]
    with pytest.raises(ValueError, match="expects"):
        simulate([np.ones(4), np.ones(4)], bad)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_fp16_wire_rounds_once_and_replicas_agree(algorithm):
    rng = np.random.default_rng(0)
    bufs = [rng.standard_normal(300).astype(np.float32) for _ in range(5)]
    scheds = [schedule(algorithm, r, 5, 300, groups_of_size(5, 2)) for r in range(5)]
    out = simulate(bufs, scheds, wire=lambda x: x.astype(np.float16))
    for res in out:
        np.testing.assert_array_equal(res, out[0])
        np.testing.assert_allclose(res, np.sum(bufs, axis=0), rtol=0, atol=0.02)


def test_node_groups():
    assert groups_of_size(7, 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert groups_from_nodes(["b", "a", "b", "a"]) == [[0, 2], [1, 3]]
    with pytest.raises(ValueError, match="node size 0"):
        groups_of_size(4, 0)
    with pytest.raises(ValueError, match="partition"):
        schedule("hierarchical", 0, 4, 8, [[0, 1], [1, 2, 3]])


# ---------------------------------------------------------------- cost model


def _emulated_time(algorithm, n, length, groups=None):
    """Run every rank's rounds through per-rank NICs: a message leaves when its sender has
    received everything of the previous rounds; the allreduce ends at the last delivery."""
    link = LinkSpec(bandwidth=B, latency=A)
    nics = [Nic(link) for _ in range(n)]
    scheds = [schedule(algorithm, r, n, length, groups) for r in range(n)]
    ready = [0.0] * n
    for t in range(len(scheds[0])):
        msgs = []
        for src in range(n):
            for tr in scheds[src][t].sends:
                dep, _ = nics[src].reserve_egress((tr.hi - tr.lo) * 4, ready[src])
                msgs.append((dep, src, tr))
        arrived = list(ready)
        for dep, _src, tr in sorted(msgs, key=lambda m: m[0]):
            done = nics[tr.peer].reserve_ingress((tr.hi - tr.lo) * 4, dep)
            arrived[tr.peer] = max(arrived[tr.peer], done)
        ready = arrived
    return max(ready)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 8])
def test_cost_model_matches_the_nic_emulator(algorithm, n):
    """Every table entry's cost against its own schedule run through the NICs."""
    length = 8 * 7 * 5 * 3 * 1000  # K = 4*length bytes, divisible by every chunk count
    node = 2 if n > 2 else None
    groups = groups_of_size(n, node or n)
    expected = ALGORITHMS[algorithm].cost(n, 4.0 * length, A, B, 1, node or n, len(groups))
    assert allreduce_comm_s(algorithm, n, 4.0 * length, A, B, node_size=node or n,
                            nodes=len(groups)) == expected
    got = _emulated_time(algorithm, n, length, groups)
    if algorithm == "tree" and n & (n - 1):
        # A subtree that finishes early sends ahead of its round and hides latency: the
        # formula is an upper bound, tight within one latency per round.
        assert expected - 2 * (n - 1).bit_length() * A <= got <= expected + 1e-12
    else:
        assert got == pytest.approx(expected)


def test_the_table_is_one_consistent_entry_per_algorithm():
    assert list(ALGORITHMS) == ["ring", "halving-doubling", "tree", "hierarchical"]
    for name, alg in ALGORITHMS.items():
        assert isinstance(alg, Algorithm) and alg.name == name
        assert alg.message_path in ("channel", "call")
        # the ring's neighbour exchange rides the channel; the any-pair algorithms actor calls
        assert (alg.message_path == "channel") == alg.neighbour_exchange
        assert "K" in alg.formula and "a" in alg.formula
        # schedule() is the entry's schedule once the groups are checked
        groups = groups_of_size(6, 4) if alg.needs_groups else None
        assert schedule(name, 2, 6, 30, groups) == alg.schedule(2, 6, 30, groups)
        # what the spec asks of the entry: the message path, top-k only with the exchange,
        # node groups only where needed, and the map's variants
        cfg = _cfg(**{"ring.algorithm": name})
        assert SPECS["ring"].message_path(cfg) == alg.message_path
        assert _allowed(**{"ring.algorithm": name, "compression": "topk:0.01"}) == alg.neighbour_exchange
        assert _allowed(**{"ring.algorithm": name, "ring.node_size": 2}) == alg.needs_groups
        assert (name in {v.overrides["ring.algorithm"] for v in SPECS["ring"].map_variants(cfg)}) \
            == (not alg.needs_groups)
    grouped = next(name for name, alg in ALGORITHMS.items() if alg.needs_groups)
    with_nodes = _cfg(**{"ring.algorithm": grouped, "ring.node_size": 2})
    assert {v.overrides["ring.algorithm"] for v in SPECS["ring"].map_variants(with_nodes)} == set(ALGORITHMS)
    assert SPECS["ring"].choices["ring.algorithm"] == tuple(ALGORITHMS)
    with pytest.raises(ValueError, match="algorithm 'butterfly': unknown; use one of ring, halving-doubling, "
                                         "tree, hierarchical"):
        schedule("butterfly", 0, 2, 4)


def _allowed(**changes):
    try:
        _cfg(**changes)
    except ConfigError:
        return False
    return True


def test_cost_model_literals():
    # tree: 2 ceil(log2 8)(a + K/B) = 6 * 0.101
    assert tree_comm_s(8, K, A, B) == pytest.approx(0.606)
    # folded halving-doubling N=6, p=4: 2*2*a + 2*(3/4)*K/B + 2*(a + K/B) = 0.004 + 0.15 + 0.202
    assert halving_doubling_folded_comm_s(6, K, A, B) == pytest.approx(0.356)
    assert halving_doubling_folded_comm_s(8, K, A, B) == pytest.approx(0.181)
    # hierarchical 8 workers, 4 per node: 2*2*(a + K/B) + 2*(2-1)*(a + K/(2B)) = 0.404 + 0.102
    assert hierarchical_comm_s(8, K, A, B, node_size=4) == pytest.approx(0.506)
    # one worker per node is the ring; one node is the tree
    assert hierarchical_comm_s(8, K, A, B, node_size=1) == pytest.approx(ring_comm_s(8, K, A, B))
    assert hierarchical_comm_s(8, K, A, B) == pytest.approx(tree_comm_s(8, K, A, B))
    assert tree_comm_s(1, K, A, B) == hierarchical_comm_s(1, K, A, B) == 0.0


def _ring_prediction(buckets=1, **changes):
    cfg = _cfg(workers=8, **changes)
    return SPECS["ring"].predict(cfg, {"grad_bytes_logical": K, "buckets": buckets, "node_size": 4},
                                 A, B)


def test_predict_ring_by_algorithm_buckets_and_compression():
    for alg in ALGORITHMS:
        extra = {"ring.node_size": 4} if alg == "hierarchical" else {}
        out = _ring_prediction(**{"ring.algorithm": alg}, **extra)
        assert out.comm_s == pytest.approx(allreduce_comm_s(alg, 8, K, A, B, node_size=4))
        assert "K" in out.formula and out.formula == ALGORITHMS[alg].formula
    assert ALGORITHMS["tree"].formula == "2*ceil(log2(N))*(a + K/B)"
    assert ALGORITHMS["hierarchical"].formula == "2*ceil(log2(g))*(a + K/B) + 2*(M-1)*(a + K/(M*B))"
    five = _ring_prediction(buckets=5, **{"ring.algorithm": "tree"})
    assert five.comm_s == pytest.approx(6 * (5 * A + K / B)) and "b*a" in five.formula
    half = _ring_prediction(**{"ring.algorithm": "halving-doubling", "compression": "fp16"})
    assert half.comm_s == pytest.approx(halving_doubling_folded_comm_s(8, K / 2, A, B))
    topk = _ring_prediction(compression="topk:0.01")
    assert topk.comm_s == pytest.approx(7 * (A + 2 * 0.01 * K / B))
    with pytest.raises(ValueError, match="unknown"):
        allreduce_comm_s("butterfly", 8, K, A, B)


# ---------------------------------------------------------------- flags


def _cfg(**changes):
    return validate(with_overrides(RunConfig(), **changes), SPECS)


def test_algorithm_flags_validate():
    cfg = _cfg(**{"ring.algorithm": "hierarchical", "ring.node_size": 2})
    assert (cfg.ring.algorithm, cfg.ring.node_size) == ("hierarchical", 2)
    assert _cfg(**{"ring.algorithm": "halving-doubling", "ring.transport": "torch"})


@pytest.mark.parametrize(("changes", "needle"), [
    ({"ring.algorithm": "butterfly"}, "--algorithm 'butterfly': choose one of ring, halving-doubling"),
    ({"strategy": "mapreduce", "ring.algorithm": "tree"},
     f"--algorithm 'tree': applies to --strategy {'/'.join(owners(SPECS, 'ring.algorithm'))} only"),
    ({"strategy": "allreduce-torch", "ring.algorithm": "tree"},
     f"--algorithm 'tree': applies to --strategy {'/'.join(owners(SPECS, 'ring.algorithm'))} only"),
    ({"ring.node_size": 4}, "--node-size 4: groups workers into nodes for --algorithm hierarchical"),
    ({"ring.algorithm": "hierarchical", "ring.node_size": 0}, "--node-size 0: use an integer"),
    ({"strategy": "ps-sync", "ring.node_size": 2}, "--node-size 2"),
])
def test_algorithm_flags_rejected_with_one_line(changes, needle):
    with pytest.raises(ConfigError) as info:
        _cfg(**changes)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_cli_parses_algorithm_flags():
    from testbed.config import parse_config

    cfg = parse_config(["--algorithm", "hierarchical", "--node-size", "4", "--workers", "8"], SPECS)
    assert (cfg.ring.algorithm, cfg.ring.node_size, cfg.workers) == ("hierarchical", 4, 8)
