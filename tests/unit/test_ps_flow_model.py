"""ps-async's cost model (testbed.ps.flow): the run's schedule replayed on the NIC model."""

import pytest

from testbed.analysis.psmodel import ps_async_partitioned_comm_s
from testbed.emulation.network import LinkSpec, Nic
from testbed.ps.flow import ps_async_run_comm_s

A, B = 50e-6, 1.25e9  # 10 Gbit/s
K = 100 * 2**20


def test_one_worker_pays_its_round_trip():
    """Nobody to meet, and version 0 in hand: every iteration is the lone round trip."""
    for servers, parts, steps in [(1, 1, 4), (8, 25, 4), (8, 25, 10), (3, 7, 1)]:
        lone = ps_async_partitioned_comm_s(1, K, A, B, servers, parts)
        got = ps_async_run_comm_s(1, K, A, B, servers, parts, False, K, 0.1, steps)
        assert got == pytest.approx(lone, rel=1e-9)


def test_one_worker_under_ssp_pulls_from_its_second_iteration():
    """One server, one partition: iteration 0 pushes (a + K/B); the others pull, then push."""
    got = ps_async_run_comm_s(1, K, A, B, 1, 1, False, K, 0.1, 3, 0)
    assert got == pytest.approx((1 + 2 + 2) / 3 * (A + K / B), rel=1e-9)


@pytest.mark.parametrize("n", [2, 5, 16])
def test_a_one_update_run_is_the_first_round_reserved_by_hand(n):
    """One server, one partition, one update: worker 0's iteration ends first and counts, so no
    one starts a second; the N first iterations, their NIC reservations written out in the order
    they happen (every push leaves once compute ends; replies in the order the pushes landed)."""
    link, compute = LinkSpec(bandwidth=B, latency=A), 0.02
    server, workers = Nic(link), [Nic(link) for _ in range(n)]
    left = [w.reserve_egress(K, compute)[0] for w in workers]
    landed = [server.reserve_ingress(K, d) for d in left]
    back = [w.reserve_ingress(K, server.reserve_egress(K, t)[0]) for w, t in zip(workers, landed, strict=True)]
    got = ps_async_run_comm_s(n, K, A, B, 1, 1, False, K, compute, 1)
    assert got == pytest.approx(sum(b - compute for b in back) / n, rel=1e-9)


def test_servers_set_the_pace_when_their_nics_are_the_limit():
    """No compute, one server: in the steady state each worker's cycle is the server NIC's N K/B,
    and ever more of the run is steady state."""
    n = 16
    short, long = (ps_async_run_comm_s(n, K, A, B, 1, 1, False, K, 0.0, s) for s in (16, 800))
    assert long == pytest.approx(n * K / B, rel=0.05)
    assert short > ps_async_partitioned_comm_s(n, K, A, B, 1, 1)


def test_spread_out_workers_meet_no_one():
    """Compute far above N K/(S B): after the first round the workers no longer queue, and a long
    run's mean tends to the lone round trip."""
    lone = ps_async_partitioned_comm_s(4, K, A, B, 4, 8)
    got = ps_async_run_comm_s(4, K, A, B, 4, 8, False, K, 10.0, 2000)
    assert lone <= got <= lone * 1.05


def test_more_workers_on_the_same_servers_wait_longer():
    means = [ps_async_run_comm_s(n, K, A, B, 8, 25, False, K, 0.1, 4) for n in (8, 16, 32, 64)]
    assert means == sorted(means) and means[-1] > 4 * means[0]


def test_colocated_servers_skip_their_own_partitions():
    """Colocated, S = N = 1: nothing crosses a network."""
    assert ps_async_run_comm_s(1, K, A, B, 1, 4, True, K, 0.1, 3) == 0.0
    lone = ps_async_partitioned_comm_s(4, K, A, B, 4, 8, colocated=True)
    assert ps_async_run_comm_s(4, K, A, B, 4, 8, True, K, 0.1, 8) > lone


@pytest.mark.parametrize("args", [(0, 1, 1, 4, None), (2, 0, 1, 4, None), (2, 2, 1, 4, None),
                                  (2, 1, 1, 0, None), (2, 1, 1, 4, -1)])
def test_bad_arguments_are_refused(args):
    n, servers, parts, steps, bound = args
    with pytest.raises(ValueError, match="need"):
        ps_async_run_comm_s(n, K, A, B, servers, parts, False, K, 0.1, steps, bound)
