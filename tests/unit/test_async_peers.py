"""ps-async's emulated peers' timelines (testbed.ps.async_peers), against arithmetic done by hand
on a 1 GB/s, 1 ms link."""

import pytest

from testbed.emulation.network import LinkSpec
from testbed.ps.async_peers import AsyncPeers, Notice

LINK = LinkSpec(bandwidth=1e9, latency=1e-3)
SIZES = [1000, 2000, 1000]  # partitions 0 and 2 on server 0, 1 on server 1
SERVERS = [0, 1, 0]


def peers() -> AsyncPeers:
    # 4 workers, worker 0 real; peer 2 straggles 50 ms every iteration
    return AsyncPeers(4, 1, SIZES, SERVERS, LINK, lambda x, c: (0.1, 0.05 if x == 2 else 0.0))


def note(part, departure, *, staleness, version, iteration=0, status="applied"):
    return Notice(part, 2, iteration, status, version - 1 if status == "applied" else None,
                  staleness if status == "applied" else None, version, departure, 0.5, 8,
                  {"version": version} if part == 0 and status == "applied" else None)


def test_a_peer_pushes_its_partitions_back_to_back_once_its_compute_and_delay_are_over():
    p = peers()
    assert p.positions == [1, 2, 3] and p.owner == {1: 0, 2: 0, 3: 0}
    out = p.start(2, 10.0)
    push = 10.0 + 0.1 + 0.05
    assert sorted(out) == [0, 1]
    (p0, p2), (p1,) = out[0], out[1]
    assert p0[:4] == (0, 2, 0, 0) and p0[4] == pytest.approx(push) and p0[5] == 0
    assert p1[:4] == (1, 2, 0, 0) and p1[4] == pytest.approx(push + 1e-6)  # after partition 0's 1000 B
    assert p2[:4] == (2, 2, 0, 0) and p2[4] == pytest.approx(push + 3e-6)
    assert p.running == 1


def test_an_iteration_ends_when_its_peers_ingress_delivers_the_last_reply_in_departure_order():
    p = peers()
    p.start(2, 10.0)
    p.take([note(1, 11.0, staleness=1, version=5), note(0, 10.5, staleness=3, version=4)])
    assert p.next_end() is None  # partition 2 has not answered
    p.take([note(2, 10.5, staleness=2, version=3)])
    # 10.5: partition 0 lands at 10.5 + 1 ms + 1 us, partition 2 a microsecond behind it; 11.0:
    # partition 1, 2000 B
    end = 11.0 + 1e-3 + 2e-6
    assert p.next_end() == pytest.approx(end)
    assert p.ended(end - 1e-3) == []
    (done,) = p.ended(end)
    assert (done.position, done.iteration) == (2, 0)
    assert done.comm_s == pytest.approx(end - 10.15) and done.t_end == pytest.approx(end)
    assert done.compute_s == 0.1 and done.injected_s == 0.05
    assert (done.version_read, done.version_applied) == (0, 3)  # the stalest partition
    assert done.update == {"version": 4} and done.bytes_sent == done.bytes_recv == 4000
    assert p.running == 0 and p.read[2] == [4, 5, 3]  # what its next gradient is computed from
    assert p.take_held(0) == [] and p.take_held(5) == [2]
    out = p.start(2, end)
    assert [e[5] for e in out[0]] == [4, 3] and out[1][0][5] == 5 and out[0][0][3] == 1


def test_a_push_not_applied_everywhere_has_no_version_applied():
    p = peers()
    p.start(2, 0.0)
    p.take([note(0, 1.0, staleness=0, version=1), note(1, 1.0, staleness=0, version=1, status="finished"),
            note(2, 1.0, staleness=0, version=1)])
    (done,) = p.ended(2.0)
    assert done.version_applied == 0  # a partition that had finished does not make it unapplied
    p.start(2, 2.0)
    p.take([note(0, 3.0, staleness=0, version=2, iteration=1, status="nan"),
            note(1, 3.0, staleness=0, version=2, iteration=1), note(2, 3.0, staleness=0, version=2, iteration=1)])
    (done,) = p.ended(4.0)
    assert done.version_applied is None and done.update is None


def test_a_notice_of_an_iteration_not_in_flight_is_refused():
    p = peers()
    with pytest.raises(ValueError, match="peer 2: a notice of iteration 0"):
        p.take([note(0, 1.0, staleness=0, version=1)])
