"""Resource planning before any actor exists: shares, GPUs, and shortfalls as ConfigError."""

import pytest

from testbed.config import ConfigError
from testbed.runtime.cluster import (
    ACTOR_MEMORY_TORCH,
    RAY_GRANULARITY,
    node_labels,
    packable_share,
    plan_resources,
)

GIB = 2**30


def plan(**kw):
    base = dict(workers=8, servers=0, total_cpus=2, total_gpus=0, total_memory=16 * GIB, device="auto",
                cpus_per_worker=None, torch_workers=True)
    return plan_resources(**{**base, **kw})


def test_fractional_share_lets_8_workers_fit_on_2_cores():
    p = plan()
    assert p.cpus_per_worker == pytest.approx(0.25) and p.device == "cpu" and p.gpus_per_worker == 0


def test_servers_share_the_cpus_too():
    p = plan(workers=3, servers=1)
    assert p.cpus_per_worker == pytest.approx(0.5) and p.cpus_per_server == pytest.approx(0.5)


def test_share_is_rounded_down_to_ray_granularity():
    p = plan(workers=3)
    assert p.cpus_per_worker <= 2 / 3 and abs(p.cpus_per_worker / RAY_GRANULARITY - round(p.cpus_per_worker / RAY_GRANULARITY)) < 1e-6


def test_cuda_without_gpu_is_an_error():
    with pytest.raises(ConfigError, match="--device 'cuda'"):
        plan(device="cuda")


def test_gpus_are_shared_fractionally():
    p = plan(workers=4, total_gpus=1)
    assert p.device == "cuda" and p.gpus_per_worker == pytest.approx(0.25)


def test_too_many_workers_for_memory_is_an_error_naming_the_count():
    with pytest.raises(ConfigError, match="--workers 100000") as exc:
        plan(workers=100000)
    assert "at most" in str(exc.value)
    fit = int(16 * GIB // ACTOR_MEMORY_TORCH)
    assert f"use at most {fit} workers" in str(exc.value)


def test_explicit_cpu_share_beyond_the_cluster_is_an_error():
    with pytest.raises(ConfigError, match="--cpus-per-worker 1"):
        plan(workers=4, cpus_per_worker=1.0)


def test_unreachable_address_fails_fast():
    import time

    from testbed.runtime.rayprocs import check_reachable

    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="--address '127.0.0.1:1'"):
        check_reachable("127.0.0.1:1")
    with pytest.raises(ConfigError, match="HOST:PORT"):
        check_reachable("nonsense")
    assert time.monotonic() - t0 < 10


def test_colocated_servers_share_their_workers_bundles():
    """Server i rides in worker i's bundle (so on its node) with its own CPU share on top."""
    from testbed.config import ClusterConfig
    from testbed.runtime.cluster import Cluster

    c = Cluster(ClusterConfig(), workers=4, servers=2, colocated=True)
    c.plan = plan(workers=4, servers=2)
    share = c.plan.cpus_per_worker
    assert [c._bundle(i)["CPU"] for i in range(4)] == pytest.approx([2 * share, 2 * share, share, share])
    dedicated = Cluster(ClusterConfig(), workers=4, servers=2)
    dedicated.plan = c.plan
    assert [dedicated._bundle(i)["CPU"] for i in range(6)] == pytest.approx([share] * 6)


def _fits(units, nodes, share):
    """Trivially correct reference: try every assignment of bundles to nodes."""
    import itertools

    for where in itertools.product(range(len(nodes)), repeat=len(units)):
        load = [0.0] * len(nodes)
        for u, n in zip(units, where, strict=True):
            load[n] += u * share
        if all(load[n] <= nodes[n] + 1e-9 for n in range(len(nodes))):
            return True
    return False


@pytest.mark.parametrize(("units", "nodes"), [
    ([1] * 5, [2, 2]), ([1] * 4, [2, 2]), ([2, 2, 1, 1], [2, 2]), ([1] * 7, [2, 2, 2]),
    ([1] * 6, [4, 1, 1]), ([2, 1, 1, 1], [1.5, 3]), ([1] * 3, [2]),
])
def test_the_share_is_the_largest_every_bundle_fits_on_some_node(units, nodes):
    cap = min(1.0, sum(nodes) / sum(units))
    share = packable_share(units, nodes, cap)
    assert 0 < share <= cap and _fits(units, nodes, share)
    finer = share + 10 * RAY_GRANULARITY  # a visibly larger share fits no assignment (or passes the cap)
    assert finer > cap or not _fits(units, nodes, finer)


def test_five_actors_on_two_2_cpu_nodes_get_two_thirds_not_four_fifths():
    p = plan(workers=4, servers=1, total_cpus=4, node_cpus=[2.0, 2.0])
    assert p.cpus_per_worker == pytest.approx(2 / 3, abs=RAY_GRANULARITY)


def test_nodes_are_named_by_address_unless_two_share_one():
    nodes = [{"NodeID": "aa" * 28, "NodeManagerAddress": "10.0.0.1", "Alive": True},
             {"NodeID": "bb" * 28, "NodeManagerAddress": "10.0.0.2", "Alive": True},
             {"NodeID": "cc" * 28, "NodeManagerAddress": "10.0.0.2", "Alive": True},
             {"NodeID": "dd" * 28, "NodeManagerAddress": "10.0.0.3", "Alive": False}]
    assert node_labels(nodes) == {"aa" * 28: "10.0.0.1", "bb" * 28: "10.0.0.2/bbbbbb",
                                  "cc" * 28: "10.0.0.2/cccccc"}


def test_shared_processes_are_planned_per_process_and_named_as_given():
    """--workers-per-process 16: 8 processes of 16 workers. The memory and CPU checks count
    processes, the errors name the flag and the processes, and the bound they advise is in
    workers; --cpus-per-worker stays per worker (a process gets 16 of them)."""
    fit = int(16 * GIB // ACTOR_MEMORY_TORCH)
    with pytest.raises(ConfigError) as exc:
        plan(workers=fit + 1, per_process=16)
    msg = str(exc.value)
    assert msg.startswith(f"--workers-per-process 16: {fit + 1} worker processes") and "--workers " not in msg
    assert f"use at most {fit * 16} workers" in msg
    p = plan(workers=8, per_process=16, total_cpus=2, cpus_per_worker=0.015625)
    assert p.cpus_per_worker == pytest.approx(0.25)  # 16 workers' shares in each of the 8 processes
    with pytest.raises(ConfigError, match=r"--cpus-per-worker 0.25: 128 workers need 32 CPUs"):
        plan(workers=8, per_process=16, cpus_per_worker=0.25)
