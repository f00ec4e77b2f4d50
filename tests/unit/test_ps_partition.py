"""Partitions of the parameter server without Ray: how they are cut and dealt, and the order in
which a synchronous version's replies go out."""

import numpy as np
import pytest

from testbed.ps.partition import MiB, partition, partition_count
from testbed.ps.shard import ShardState
from testbed.training.optim import OptimizerSpec


@pytest.mark.parametrize(("k_mib", "p_mb", "servers", "want"), [
    (100, 4, 1, 25), (100, 4, 8, 25), (100, 4, 32, 32), (100, 1, 3, 100), (4, 4, 1, 1),
    (4.5, 4, 1, 2), (100, 0, 3, 3), (0.001, 4, 2, 2),
])
def test_partition_count_is_ceil_k_over_p_and_at_least_one_per_server(k_mib, p_mb, servers, want):
    assert partition_count(k_mib * MiB, p_mb, servers, numel=10**6) == want


def test_partitions_cover_the_parameters_once_and_balance_servers_by_bytes():
    numel, servers = 1003, 3
    parts = partition(numel, 100 * MiB, 4.0, servers)
    flat = np.concatenate([np.arange(lo, hi) for lo, hi in parts.bounds])
    np.testing.assert_array_equal(flat, np.arange(numel))  # in order, no gap, no overlap
    sizes = [hi - lo for lo, hi in parts.bounds]
    assert max(sizes) - min(sizes) <= 1
    held = [sum(sizes[p] for p in parts.on_server(s)) for s in range(servers)]
    assert max(held) - min(held) <= max(sizes)  # at most one partition apart
    assert parts.server_of[:4] == (0, 1, 2, 0)  # consecutive pushes go to different servers


def test_partitioning_off_is_one_partition_per_server_and_never_more_than_elements():
    off = partition(10, 100 * MiB, 0.0, 4)
    assert off.count == 4 and off.server_of == (0, 1, 2, 3)
    assert partition(3, 100 * MiB, 1.0, 1).count == 3  # one element each, at most


def test_a_partition_larger_than_a_tensor_and_a_tensor_larger_than_a_partition_both_work():
    # the flat range ignores tensor boundaries: a 4-MiB partition spans small tensors, and a
    # large tensor is cut across partitions -- every element still has exactly one owner
    parts = partition(10_000, 10_000 * 4, 0.01, 2)  # 40 kB of gradient in 10 kB partitions
    assert parts.count == 4 and sum(hi - lo for lo, hi in parts.bounds) == 10_000


def test_the_version_completing_push_lists_contributors_in_delivery_order():
    s = ShardState(np.zeros(2, np.float32), optimizer=OptimizerSpec(lr=1.0), sync=True, workers=3)
    g = np.ones(2, np.float32)
    acks = [s.push(g, 0, worker=w, iteration=0, loss=0.0, delivered=t)
            for w, t in ((2, 5.0), (0, 7.0), (1, 6.0))]  # pushes handled out of delivery order
    assert "contributors" not in acks[0] and "contributors" not in acks[1]
    assert acks[2]["contributors"] == [2, 1, 0]
    assert s.arrived == []


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_bad_partition_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="partition_mb"):
        partition_count(MiB, bad, 1, 10)


def test_asynchronous_servers_share_a_cap_on_call_threads_and_waiting_ones_are_refused_past_it():
    """A server has a thread per push-pull its partitions can have in flight. ps-sync and SSP
    calls wait for versions other pushes make, so theirs are never capped (fewer could deadlock)
    and servers that would need more than one machine's share are refused with the fix; plain
    ps-async servers share the cap, since Ray starts every thread with the actor."""
    from testbed.config import RunConfig, with_overrides
    from testbed.config.validate import validate
    from testbed.ps.spec import SERVER_THREADS
    from testbed.strategies.registry import SPECS

    def threads(strategy: str, workers: int, servers: int = 8, nodes: int = 1, **changes):
        cfg = validate(with_overrides(RunConfig(strategy=strategy, workers=workers), **changes), SPECS)
        each = [SPECS[strategy].server_threads(cfg, 4, servers)] * servers
        return each[0], SPECS[strategy].threads_refused(cfg, each, nodes)

    assert threads("ps-async", 8) == (2 * 8 * 4 + 4, None)  # below the cap: one each
    assert threads("ps-async", 1024) == (SERVER_THREADS // 8, None)  # 8 share the cap
    assert threads("ps-async", 1024, servers=2) == (SERVER_THREADS // 2, None)
    each, why = threads("ps-async", 1024, **{"ps.staleness_bound": 2})
    assert each == 2 * 1024 * 4 + 4 and "fewer --workers" in why and "--ps-partition-mb" in why
    each, why = threads("ps-sync", 1024, **{"cluster.real_workers": 1024, "network.bandwidth": "10Gbit"})
    assert each == 2 * 1024 * 4 + 4 and f"{8 * each:,} call threads" in why and "--real-workers K" in why
    assert threads("ps-sync", 1024, **{"network.bandwidth": "10Gbit"}) == (2 * 16 * 4 + 4, None)  # 16 real
    assert threads("ps-sync", 1024, nodes=2, **{"cluster.real_workers": 1024})[1] is None  # spread over nodes
