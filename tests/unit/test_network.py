"""Tests for testbed.emulation.network: NIC queue arithmetic, sleeping, and simulate()."""

import threading

import pytest

from testbed.analysis.costmodel import ps_sync_comm_s, ring_comm_s
from testbed.emulation.network import Flows, LinkSpec, Nic, simulate, sleep_until

A = 1e-3  # latency, s
B = 1e6  # bandwidth, bytes/s
N_BYTES = 5_000  # -> 5 ms on one queue
LINK = LinkSpec(bandwidth=B, latency=A)


def test_linkspec_transfer_and_one_way():
    assert LINK.transfer_s(N_BYTES) == pytest.approx(N_BYTES / B)
    assert LINK.one_way_s(N_BYTES) == pytest.approx(A + N_BYTES / B)
    assert LINK.transfer_s(0) == 0.0


@pytest.mark.parametrize(
    ("bw", "lat"),
    [
        (0.0, 0.0),
        (-1.0, 0.0),
        (float("nan"), 0.0),
        (float("inf"), 0.0),
        (1.0, -1.0),
        (1.0, float("nan")),
    ],
)
def test_linkspec_rejects_bad_values(bw, lat):
    with pytest.raises(ValueError, match=r"must be"):
        LinkSpec(bandwidth=bw, latency=lat)


def test_negative_bytes_rejected():
    with pytest.raises(ValueError, match="nbytes -1"):
        Nic(LINK).reserve_egress(-1, 0.0)


def test_one_message_delivers_at_latency_plus_transfer():
    sender, receiver = Nic(LINK), Nic(LINK)
    departure, egress_done = sender.reserve_egress(N_BYTES, now=10.0)
    assert departure == 10.0
    assert egress_done == pytest.approx(10.0 + N_BYTES / B)
    delivery = receiver.reserve_ingress(N_BYTES, departure)
    assert delivery == pytest.approx(10.0 + A + N_BYTES / B)


@pytest.mark.parametrize("n_senders", [1, 2, 5, 16])
def test_simultaneous_pushes_serialise_at_receiver(n_senders):
    receiver = Nic(LINK)
    deliveries = []
    for _ in range(n_senders):
        departure, _ = Nic(LINK).reserve_egress(N_BYTES, now=0.0)
        assert departure == 0.0  # each sender has its own idle egress
        deliveries.append(receiver.reserve_ingress(N_BYTES, departure))
    expected = [A + k * N_BYTES / B for k in range(1, n_senders + 1)]
    assert deliveries == pytest.approx(expected)


def test_back_to_back_sends_serialise_at_egress():
    sender = Nic(LINK)
    receivers = [Nic(LINK) for _ in range(4)]
    deliveries = []
    for k, receiver in enumerate(receivers):
        departure, done = sender.reserve_egress(N_BYTES, now=0.0)
        assert departure == pytest.approx(k * N_BYTES / B)
        assert done == pytest.approx((k + 1) * N_BYTES / B)
        deliveries.append(receiver.reserve_ingress(N_BYTES, departure))
    assert deliveries == pytest.approx([A + (k + 1) * N_BYTES / B for k in range(4)])


def test_idle_queues_do_not_delay_late_messages():
    sender, receiver = Nic(LINK), Nic(LINK)
    first, _ = sender.reserve_egress(N_BYTES, now=0.0)
    receiver.reserve_ingress(N_BYTES, first)
    # Long after both queues drained: no residual waiting.
    second, _ = sender.reserve_egress(N_BYTES, now=100.0)
    assert second == 100.0
    assert receiver.reserve_ingress(N_BYTES, second) == pytest.approx(100.0 + A + N_BYTES / B)


def test_counters():
    sender, receiver = Nic(LINK), Nic(LINK)
    for size in (10, 20, 30):
        departure, _ = sender.reserve_egress(size, 0.0)
        receiver.reserve_ingress(size, departure)
    assert sender.counters() == {
        "bytes_out": 60,
        "bytes_in": 0,
        "messages_out": 3,
        "messages_in": 0,
    }
    assert (receiver.bytes_in, receiver.messages_in) == (60, 3)
    assert (receiver.bytes_out, receiver.messages_out) == (0, 0)


def test_threads_never_share_an_ingress_slot():
    receiver = Nic(LINK)
    results = []
    lock = threading.Lock()

    def push():
        got = receiver.reserve_ingress(N_BYTES, 0.0)
        with lock:
            results.append(got)

    threads = [threading.Thread(target=push) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == pytest.approx([A + k * N_BYTES / B for k in range(1, 33)])


class FakeClock:
    def __init__(self, now=0.0):
        self.now = now
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def test_sleep_until_sleeps_exactly_once_for_the_gap():
    clock = FakeClock(5.0)
    assert sleep_until(7.5, clock=clock, sleep=clock.sleep) == pytest.approx(2.5)
    assert clock.sleeps == [pytest.approx(2.5)]
    assert clock.now == pytest.approx(7.5)


def test_sleep_until_past_time_does_not_sleep():
    clock = FakeClock(5.0)
    assert sleep_until(4.0, clock=clock, sleep=clock.sleep) == 0.0
    assert sleep_until(5.0, clock=clock, sleep=clock.sleep) == 0.0
    assert clock.sleeps == []


def test_sleep_until_resumes_after_early_wakeup():
    clock = FakeClock(0.0)

    def interrupted_once(seconds):
        # Wake after half the requested time on the first call (as a signal would).
        clock.sleeps.append(seconds)
        clock.now += seconds / 2 if len(clock.sleeps) == 1 else seconds

    sleep_until(4.0, clock=clock, sleep=interrupted_once)
    assert clock.sleeps == [pytest.approx(4.0), pytest.approx(2.0)]
    assert clock.now == pytest.approx(4.0)


def test_sleep_until_gives_up_on_a_frozen_clock():
    calls = []
    assert sleep_until(1.0, clock=lambda: 0.0, sleep=calls.append) == pytest.approx(1.0)
    assert calls == [1.0]


def test_sleep_until_real_clock_smoke():
    import time

    start = time.time()
    sleep_until(start + 0.02)
    assert time.time() >= start + 0.02


def test_simulate_single_message():
    assert simulate([("w0", "ps", N_BYTES, 2.0)], LINK) == pytest.approx([2.0 + A + N_BYTES / B])


def test_simulate_returns_input_order_but_serves_by_ready_time():
    msgs = [("w1", "ps", N_BYTES, 1.0), ("w0", "ps", N_BYTES, 0.0)]
    late, early = simulate(msgs, LINK)
    assert early == pytest.approx(A + N_BYTES / B)
    # w1 is ready at 1.0 > early delivery, so it is not delayed by w0's message.
    assert late == pytest.approx(1.0 + A + N_BYTES / B)


def test_simulate_rejects_self_messages():
    with pytest.raises(ValueError, match="sender equals receiver"):
        simulate([("w0", "w0", 1, 0.0)], LINK)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_simulated_pushes_match_half_of_ps_sync(n):
    k = 40_000
    deliveries = simulate([(f"w{i}", "ps", k, 0.0) for i in range(n)], LINK)
    push_phase = max(deliveries)
    assert push_phase == pytest.approx(ps_sync_comm_s(n, k, A, B) / 2)


def test_simulated_sharded_push_within_formula_plus_one_chunk():
    n, s, k = 8, 4, 40_000
    chunk = k / s
    # Worker w starts with shard w % s so the shards are fed in parallel.
    msgs = [(f"w{w}", f"ps{(w + j) % s}", chunk, 0.0) for w in range(n) for j in range(s)]
    push_phase = max(simulate(msgs, LINK))
    half = ps_sync_comm_s(n, k, A, B, shards=s) / 2
    assert half - 1e-12 <= push_phase <= half + chunk / B + 1e-12


def simulate_ring(n, k, link):
    """Run the 2(N-1) dependent rounds of a ring allreduce; return the finish time."""
    chunk = k / n
    ready = [0.0] * n  # time worker i may start its next send
    for _ in range(2 * (n - 1)):
        msgs = [(i, (i + 1) % n, chunk, ready[i]) for i in range(n)]
        delivered = simulate(msgs, link)
        # Worker i's next send needs the chunk it just received from i-1.
        ready = [delivered[(i - 1) % n] for i in range(n)]
    return max(ready)


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
def test_simulated_ring_matches_ring_formula(n):
    k = 64_000
    assert simulate_ring(n, k, LINK) == pytest.approx(ring_comm_s(n, k, A, B))


def test_ring_and_ps_formulas_differ_so_the_checks_can_fail():
    n, k = 8, 64_000
    assert simulate_ring(n, k, LINK) != pytest.approx(ps_sync_comm_s(n, k, A, B))


def test_simulate_serves_ingress_in_departure_order():
    big = 10 * N_BYTES
    msgs = [
        ("w0", "r1", big, 0.0),  # occupies w0's egress for 50 ms
        ("w0", "r2", N_BYTES, 0.0),  # so this one departs at 50 ms
        ("w1", "r2", N_BYTES, 0.001),  # departs at 1 ms and must not wait for it
    ]
    _, queued, early = simulate(msgs, LINK)
    assert early == pytest.approx(0.001 + A + N_BYTES / B)
    assert queued == pytest.approx(big / B + A + N_BYTES / B)


def test_a_shared_nic_queues_the_messages_of_two_processes_as_one(tmp_path):
    """Two processes (a worker and the server colocated with it) sending through one NIC file
    serialise on its egress exactly as one in-process Nic would."""
    import multiprocessing

    path = str(tmp_path / "nic")
    Nic.create_shared(path)

    def send(q):
        q.put(Nic(LINK, shared=path).reserve_egress(N_BYTES, 0.0))

    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=send, args=(q,)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()  # each makes one reservation and exits; pytest's timeout guards a hang
        assert p.exitcode == 0
    got = sorted(q.get() for _ in procs)
    one = Nic(LINK)
    want = [one.reserve_egress(N_BYTES, 0.0) for _ in procs]
    # (departure, done) pairs, flattened: pytest.approx compares flat sequences only
    assert [t for pair in got for t in pair] == pytest.approx([t for pair in want for t in pair])
    shared = Nic(LINK, shared=path)
    assert (shared.bytes_out, shared.messages_out) == (3 * N_BYTES, 3)
    assert shared.reserve_ingress(N_BYTES, 0.0) == one.reserve_ingress(N_BYTES, 0.0)


def test_flows_order_messages_leaving_together_by_rank():
    """Two messages that leave at the same instant from two senders: the receiver takes the
    lower rank first, whatever the order they were sent in."""
    for ranks, first in [((0.0, 0.0), 0), ((0.7, 0.2), 1)]:
        flows = Flows(LINK)
        got: dict[int, float] = {}
        for i, rank in enumerate(ranks):
            flows.send(f"w{i}", "ps", N_BYTES, 1.0, lambda t, i=i, got=got: got.__setitem__(i, t), rank)
        flows.run()
        assert got[first] == pytest.approx(1.0 + A + N_BYTES / B)
        assert got[1 - first] == pytest.approx(got[first] + N_BYTES / B)
