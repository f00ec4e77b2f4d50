"""The ring with emulated peers (testbed.allreduce.relay) against a ring of N real positions.

The reference is the plainest one: every position of the N-ring with its own NIC
(testbed.emulation.network.Nic), stepped cell by cell, and the ring's data by
`ring.reference_allreduce` over every position's copy of its owner's gradient. The relay's real
workers run `relay_allreduce` on threads (one per real worker, as processes would), linked by
blocking mailboxes; their deliveries and sums must equal the reference's at their positions.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from testbed.allreduce.relay import Loopback, Relay, relay_allreduce
from testbed.allreduce.ring import allgather_schedule, reference_allreduce, scatter_reduce_schedule
from testbed.emulation.network import LinkSpec, Nic
from testbed.emulation.peers import owner, real_positions, segment_sizes, weights
from testbed.util.split import chunk_bounds

LINK = LinkSpec(bandwidth=1e6, latency=3e-4)


def reference_times(n: int, lengths: list[int], ready: list[np.ndarray]) -> list[np.ndarray]:
    """Deliveries A[x, s] of each allreduce (one per bucket, in order) on a ring of n NICs."""
    nics = [Nic(LINK) for _ in range(n)]
    out = []
    for length, r in zip(lengths, ready, strict=True):
        bounds = chunk_bounds(length, n)
        sched = [scatter_reduce_schedule(x, n) + allgather_schedule(x, n) for x in range(n)]
        steps = 2 * (n - 1)
        arrive = np.zeros((n, steps))
        now = np.array(r, dtype=float)
        for s in range(steps):
            deps = []
            for x in range(n):
                lo, hi = bounds[sched[x][s][0]]
                deps.append(nics[x].reserve_egress((hi - lo) * 4, now[x])[0])
            for x in range(n):
                lo, hi = bounds[sched[(x + 1) % n][s][1]]
                arrive[(x + 1) % n, s] = nics[(x + 1) % n].reserve_ingress((hi - lo) * 4, deps[x])
            now = arrive[:, s]
        out.append(arrive)
    return out


class Recorder:
    """An endpoint that keeps every delivery it computed."""

    def __init__(self) -> None:
        self.nic = Nic(LINK)
        self.deliveries: list[float] = []

    def send(self, nbytes: int, at: float | None = None) -> float:
        return self.nic.reserve_egress(nbytes, at)[0]

    def delivery(self, nbytes: int, departure: float, arrived: float | None = None, timed: bool = True) -> float:
        t = self.nic.reserve_ingress(nbytes, departure)
        self.deliveries.append(t)
        return t

    def finish(self, due: float) -> None:
        self.end = due


class Links:
    """Blocking mailboxes between threads: real worker r sends to r + 1, depth one as the ring's
    channels (testbed.allreduce.channels): a send waits until the last message was read."""

    def __init__(self, k: int) -> None:
        self.cv = threading.Condition()
        self.boxes: list[dict] = [{} for _ in range(k)]
        self.k = k

    def end(self, r: int):
        links = self

        class End:
            def send(self, tag, departure, chunk):
                with links.cv:
                    box = links.boxes[(r + 1) % links.k]
                    assert links.cv.wait_for(lambda: not box, timeout=30), f"send {tag}: never read"
                    box[tag] = np.array(chunk, copy=True)
                    links.cv.notify_all()

            def recv(self, tag):
                with links.cv:
                    assert links.cv.wait_for(lambda: tag in links.boxes[r], timeout=30), tag
                    chunk = links.boxes[r].pop(tag)
                    links.cv.notify_all()
                    return None, chunk
        return End()


def run_relay(n: int, k: int, grads: dict[int, list[np.ndarray]], ready: list[np.ndarray]):
    """Every real worker's buffers and deliveries after the buckets, in order."""
    q, m = real_positions(n, k), segment_sizes(n, k)
    links = Links(k)
    result: dict[int, tuple[list[np.ndarray], list[float]]] = {}
    errors: list[BaseException] = []

    def worker(r: int) -> None:
        try:
            endpoint, relay = Recorder(), Relay(n, q[r], m[r], LINK, 1.0)
            io = Loopback() if k == 1 else links.end(r)
            bufs = []
            for b, g in enumerate(grads[q[r]]):
                buf = g.copy()
                peers = np.full(m[r] + 1, np.nan)
                peers[1:] = ready[b][q[r] + 1:q[r] + 1 + m[r]]
                relay_allreduce(buf, q[r], n, relay, m[r - 1], io, ("bucket", b), endpoint,
                                float(ready[b][q[r]]), peers)
                bufs.append(buf)
            result[r] = (bufs, endpoint.deliveries)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return result


@pytest.mark.parametrize(("n", "k"), [(2, 1), (2, 2), (3, 1), (5, 2), (8, 2), (8, 3), (10, 3), (7, 7), (9, 4), (8, 4)])
def test_emulated_peers_move_the_same_data_at_the_same_times_as_a_ring_of_n(n, k):
    rng = np.random.default_rng(n * 10 + k)
    lengths = [4 * n + 3, 2 * n + 1]  # uneven chunks: sizes differ by one element
    grads = {x: [rng.standard_normal(length).astype(np.float32) for length in lengths]
             for x in real_positions(n, k)}
    # bucket 1 ready at once, bucket 2 during bucket 1 (its queues carry over); emulated peers
    # are later than their owners by a straggler's draw, real ones at random
    ready = []
    for b in range(2):
        base = rng.uniform(0, 0.01, n) + b * 0.004
        for x in range(n):
            if owner(n, k, x) != x:
                base[x] = base[owner(n, k, x)] + rng.uniform(0, 0.003)
        ready.append(base)
    got = run_relay(n, k, grads, ready)
    want_t = reference_times(n, lengths, ready)
    for b in range(len(lengths)):
        copies = [grads[owner(n, k, x)][b] for x in range(n)]
        want = reference_allreduce(copies)[0]
        for r, q in enumerate(real_positions(n, k)):
            bufs, deliveries = got[r]
            np.testing.assert_allclose(bufs[b], want, rtol=1e-5, atol=1e-5)
            steps = 2 * (n - 1)
            np.testing.assert_allclose(deliveries[b * steps:(b + 1) * steps], want_t[b][q], rtol=0, atol=1e-9)


def test_the_sum_weighs_each_real_gradient_by_the_workers_it_stands_for():
    n, k = 10, 3
    grads = {q: [np.full(7, float(q + 1), np.float32)] for q in real_positions(n, k)}
    got = run_relay(n, k, grads, [np.zeros(n)])
    w = weights(n, k)
    assert w == {0: 3, 3: 3, 6: 4}
    want = sum(w[q] * (q + 1) for q in w)
    for bufs, _ in got.values():
        np.testing.assert_allclose(bufs[0], np.full(7, want))


def test_a_real_link_carries_one_batch_per_segment_length_of_steps():
    """Real worker r sends ceil(2(N-1) / m) link messages per allreduce (m its segment), not 2(N-1)."""
    n = 12  # one real worker: its segment of 11 peers comes back to it
    sent: list = []

    class Counting(Loopback):
        def send(self, tag, departure, chunk):
            sent.append(tag)
            super().send(tag, departure, chunk)

    relay = Relay(n, 0, n - 1, LINK, 1.0)
    buf = np.ones(40, np.float32)
    relay_allreduce(buf, 0, n, relay, n - 1, Counting(), "t", Recorder(), 0.0, np.zeros(n))
    np.testing.assert_allclose(buf, np.full(40, float(n)))
    assert len(sent) == -(-2 * (n - 1) // (n - 1)) == 2
