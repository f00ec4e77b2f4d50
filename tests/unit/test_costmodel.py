"""Tests for testbed.analysis.costmodel: literal numbers for every formula and their scaling."""

import pytest

from testbed.analysis.costmodel import (
    gossip_comm_s,
    halving_doubling_comm_s,
    mapreduce_comm_s,
    mapreduce_pipelined_comm_s,
    ps_async_comm_s,
    ps_sync_comm_s,
    ring_comm_s,
)

# Round numbers so the expected values below can be checked by hand.
K = 100e6  # 100 MB of gradients
A = 1e-3  # 1 ms latency
B = 1e9  # 1 GB/s


def test_ring_literal():
    # 2*(8-1)*(0.001 + 1e8/(8*1e9)) = 14 * 0.0135 = 0.189
    assert ring_comm_s(8, K, A, B) == pytest.approx(0.189)


def test_ring_buckets_literal():
    # 2*(4-1)*(5*0.001 + 1e8/(4*1e9)) = 6 * 0.030 = 0.18
    assert ring_comm_s(4, K, A, B, buckets=5) == pytest.approx(0.18)


def test_ring_single_worker_is_free():
    assert ring_comm_s(1, K, A, B) == 0.0
    assert ring_comm_s(1, K, A, B, buckets=7) == 0.0


def test_ring_ratio_16_over_4_without_latency():
    # T(N) = 2(N-1)/N * K/B, so T(16)/T(4) = (30/16)/(6/4) = 1.25.
    assert ring_comm_s(16, K, 0.0, B) / ring_comm_s(4, K, 0.0, B) == pytest.approx(1.25)


def test_ps_sync_literal():
    # 2*(0.001 + 8*1e8/(1*1e9)) = 2 * 0.801 = 1.602
    assert ps_sync_comm_s(8, K, A, B) == pytest.approx(1.602)


def test_ps_sync_linear_in_workers():
    t = [ps_sync_comm_s(n, K, 0.0, B) for n in (1, 2, 4, 8, 16)]
    assert t == pytest.approx([n * t[0] for n in (1, 2, 4, 8, 16)])
    # With latency the increments are constant: 2K/(S B) per extra worker.
    diffs = [ps_sync_comm_s(n + 1, K, A, B) - ps_sync_comm_s(n, K, A, B) for n in range(1, 6)]
    assert diffs == pytest.approx([2 * K / B] * 5)


@pytest.mark.parametrize("shards", [1, 2, 4, 8])
def test_ps_sync_shards_divide_bandwidth_term(shards):
    assert ps_sync_comm_s(8, K, 0.0, B, shards=shards) == pytest.approx(
        ps_sync_comm_s(8, K, 0.0, B) / shards
    )
    # The latency term is not divided.
    assert ps_sync_comm_s(8, 0.0, A, B, shards=shards) == pytest.approx(2 * A)


def test_mapreduce_literal():
    # 2*(0.001 + 4*1e8/1e9) = 2 * 0.401 = 0.802
    assert mapreduce_comm_s(4, K, A, B) == pytest.approx(0.802)


def test_mapreduce_equals_unsharded_ps_sync():
    for n in (1, 3, 16):
        assert mapreduce_comm_s(n, K, A, B) == pytest.approx(ps_sync_comm_s(n, K, A, B))


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (1, 0.0),
        # 2*3*0.001 + 2*(7/8)*0.1 = 0.006 + 0.175
        (8, 0.181),
        # non-power of two: ceil(log2 6) = 3 -> 0.006 + 2*(5/6)*0.1
        (6, 0.006 + 1 / 6),
        (2, 2 * 0.001 + 0.1),
        (1024, 20 * 0.001 + 2 * (1023 / 1024) * 0.1),
    ],
)
def test_halving_doubling_literal(n, expected):
    assert halving_doubling_comm_s(n, K, A, B) == pytest.approx(expected)


def test_halving_doubling_beats_ring_on_latency():
    assert halving_doubling_comm_s(64, 0.0, A, B) < ring_comm_s(64, 0.0, A, B)


def test_gossip_literal():
    # 0.001 + 3*0.1
    assert gossip_comm_s(3, K, A, B) == pytest.approx(0.301)
    assert gossip_comm_s(0, K, A, B) == 0.0


def test_ps_async_literal_and_independent_of_workers():
    # 2*(0.001 + 1e8/(2*1e9)) = 0.102
    assert ps_async_comm_s(4, K, A, B, shards=2) == pytest.approx(0.102)
    assert ps_async_comm_s(64, K, A, B, shards=2) == ps_async_comm_s(4, K, A, B, shards=2)


def test_ps_async_is_a_lower_bound_on_ps_sync():
    for n in (1, 4, 16):
        assert ps_async_comm_s(n, K, A, B) <= ps_sync_comm_s(n, K, A, B)


def test_pipelined_mapreduce_agrees_with_the_nic_simulation():
    """Zero-compute MapReduce step on the NIC model: parameters out, gradients back, full duplex."""
    from testbed.emulation.network import LinkSpec, simulate

    n, k = 6, 1e6
    link = LinkSpec(bandwidth=B, latency=A)
    pulls = simulate([("driver", f"w{i}", k, 0.0) for i in range(n)], link)
    pushes = simulate([(f"w{i}", "driver", k, t) for i, t in enumerate(pulls)], link)
    assert max(pushes) == pytest.approx(mapreduce_pipelined_comm_s(n, k, A, B))


@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [
        ({"workers": 0}, "workers 0"),
        ({"workers": 2.5}, "workers 2.5"),
        ({"workers": True}, "workers True"),
        ({"grad_bytes": -1.0}, "grad_bytes -1.0"),
        ({"latency": float("nan")}, "latency nan"),
        ({"bandwidth": 0.0}, "bandwidth 0.0"),
        ({"bandwidth": float("inf")}, "bandwidth inf"),
        ({"buckets": 0}, "buckets 0"),
    ],
)
def test_formulas_reject_bad_inputs(kwargs, bad):
    args = {"n": 4, "k": K, "a": A, "b": B, **kwargs}
    names = {"workers": "n", "grad_bytes": "k", "latency": "a", "bandwidth": "b"}
    args = {names.get(key, key): value for key, value in args.items()}
    with pytest.raises(ValueError) as info:
        ring_comm_s(**args)
    assert bad in str(info.value) and "\n" not in str(info.value)


def test_ps_rejects_zero_shards():
    with pytest.raises(ValueError, match="shards 0"):
        ps_sync_comm_s(4, K, A, B, shards=0)


def test_overlapped_buckets_expose_only_what_outlasts_backward():
    from testbed.analysis.costmodel import overlapped_comm_s

    # no compute: nothing to hide under, every allreduce is exposed
    assert overlapped_comm_s(0.0, 0.0, [0.5, 0.5], [0.1, 0.2]) == pytest.approx(0.3)
    # short allreduces: each ends before the next bucket is ready; only the last one shows
    assert overlapped_comm_s(0.1, 1.0, [0.5, 0.5], [0.01, 0.02]) == pytest.approx(0.02)
    # by hand: forward 0.1, backward 0.4 in shares 1/4, 1/4, 1/2 -> ready 0.2, 0.3, 0.5;
    # c = 0.15 each: ends 0.35, 0.50, 0.65 -> 0.15 after compute ends at 0.5
    assert overlapped_comm_s(0.1, 0.4, [0.25, 0.25, 0.5], [0.15] * 3) == pytest.approx(0.15)
    # a queue: long allreduces pile up behind the first; exposed = first ready + sum - compute
    assert overlapped_comm_s(0.0, 1.0, [0.1, 0.9], [2.0, 2.0]) == pytest.approx(0.1 + 4.0 - 1.0)
    with pytest.raises(ValueError, match="one share per bucket"):
        overlapped_comm_s(0.0, 1.0, [1.0], [0.1, 0.1])
