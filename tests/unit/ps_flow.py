"""Reference discrete-event simulation of the synchronous parameter server with partitions.

This is the schedule the runtime follows, replayed on the emulator's own NIC queues
(``testbed.emulation.network.Nic``), with zero compute, so that the closed forms in
``testbed.analysis.costmodel`` can be checked against it.

Symbols: N workers, S servers, K logical gradient bytes, M equal partitions of K/M bytes
(partition p lives on server p mod S; M >= S; M = S is partitioning off), a one-way latency,
B per-NIC bandwidth. Every NIC has an egress and an ingress queue of bandwidth B:
departure = max(now, egress_free_at); delivery = max(departure + a + n/B, ingress_free_at + n/B),
reservations first come, first served in the order they are made.

* Placement ``dedicated``: server s has its own NIC. ``colocated`` (S <= N): server s shares
  worker s's NIC; a message between worker s and server s is local -- no NIC, no time, no bytes.
* Worker i begins a step at t_i (0 for the first) by reserving its egress for partitions
  p = 0..M-1 in that order, all at t_i (they leave back to back; local ones are skipped and
  delivered at t_i). A worker pushes P/M bytes per partition (P = K unless compressed).
* Every ingress reservation is made at the message's departure instant, so a NIC's ingress
  serves messages in the order they reach the wire (ties: sender order, workers first).
* Partition p is aggregated the instant all N of its pushes are delivered; the server then
  reserves its egress for the N replies (K/M bytes each) in the order those pushes were
  delivered (the local reply, if any, is delivered at once without a NIC).
* Worker i's next step starts when the last of its M replies is delivered. Version v+1 of a
  partition needs all N pushes of version v, which the worker's wait for its replies ensures.

Events at one instant run deliveries (and what they trigger: aggregations, step starts, which
reserve egress) before departures (which reserve ingress), so every message that leaves at t is
known before any ingress reservation at t is made and ties are broken by sender, not by luck.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from testbed.emulation.network import LinkSpec, Nic

_DELIVERY, _DEPARTURE = 0, 1


@dataclass(frozen=True)
class Flow:
    """Step completion times ``done[v][i]`` (step v, worker i) and the two summaries."""

    done: tuple[tuple[float, ...], ...]

    @property
    def first_step_s(self) -> float:
        """When the slowest worker finishes the first step (all start at 0)."""
        return max(self.done[0])

    def steady_step_s(self, first: int = 6, last: int = 15) -> float:
        """Mean interval between the slowest worker's completions of steps FIRST-1..LAST (1-based).

        The run must go at least one step past LAST: the faster workers' next pushes share the
        NICs with the slowest worker's last replies, and a run that stops there would flatter it.
        Five steps of warm-up, not two: a few colocated runs take that long to settle (N = 16,
        S = 7, M = 25, a = 50 us, B = 25 Gbit/s: 85.7 slots a step over steps 3..12, 81 after).
        """
        ends = [max(row) for row in self.done]
        if not 2 <= first <= last < len(ends):
            raise ValueError(f"steps {first}..{last} of {len(ends)}: need 2 <= first <= last < steps")
        return (ends[last - 1] - ends[first - 2]) / (last - first + 1)


def simulate_ps(n: int, servers: int, k: float, a: float, b: float, partitions: int | None = None,
                colocated: bool = False, push: float | None = None, steps: int = 16) -> Flow:
    """Run STEPS synchronous steps of N workers and SERVERS servers; return their timing."""
    s_count = servers
    m = s_count if partitions is None else partitions
    if not 1 <= s_count <= (n if colocated else math.inf) or m < s_count:
        raise ValueError(f"servers {s_count!r}, partitions {m!r}: need 1 <= S (<= N colocated) <= M")
    link = LinkSpec(bandwidth=b, latency=a)
    workers = [Nic(link, f"w{i}") for i in range(n)]
    # The sender rank orders ties at an ingress: workers 0..N-1, dedicated servers after them.
    if colocated:
        server_nic, server_rank = workers[:s_count], list(range(s_count))
    else:
        server_nic = [Nic(link, f"s{s}") for s in range(s_count)]
        server_rank = [n + s for s in range(s_count)]
    push_bytes = (k if push is None else push) / m
    reply_bytes = k / m

    heap: list[tuple] = []
    seq = 0

    def at(t: float, kind: int, rank: int, action: tuple) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, kind, rank if kind == _DEPARTURE else 0, seq, action))

    def local(s: int, i: int) -> bool:
        return colocated and s == i

    arrived: dict[tuple[int, int], list[int]] = {}  # (partition, version) -> workers, in order
    replies = [0] * n
    done = [[math.nan] * n for _ in range(steps)]
    version = [0] * n

    def start(i: int, t: float) -> None:
        for p in range(m):
            s = p % s_count
            if local(s, i):
                at(t, _DELIVERY, 0, ("push", i, p, version[i]))
                continue
            departure, _ = workers[i].reserve_egress(push_bytes, t)
            at(departure, _DEPARTURE, i, ("push", i, p, version[i]))

    def deliver(t: float, what: str, i: int, p: int, v: int) -> None:
        if what == "push":
            got = arrived.setdefault((p, v), [])
            got.append(i)
            if len(got) < n:
                return
            s = p % s_count
            for j in arrived.pop((p, v)):
                if local(s, j):
                    at(t, _DELIVERY, 0, ("reply", j, p, v))
                    continue
                departure, _ = server_nic[s].reserve_egress(reply_bytes, t)
                at(departure, _DEPARTURE, server_rank[s], ("reply", j, p, v))
            return
        replies[i] += 1
        if replies[i] < m:
            return
        replies[i] = 0
        done[v][i] = t
        version[i] = v + 1
        if v + 1 < steps:
            start(i, t)

    for i in range(n):
        start(i, 0.0)
    while heap:
        t, kind, _, _, (what, i, p, v) = heapq.heappop(heap)
        if kind == _DELIVERY:
            deliver(t, what, i, p, v)
            continue
        nbytes = push_bytes if what == "push" else reply_bytes
        target = server_nic[p % s_count] if what == "push" else workers[i]
        at(target.reserve_ingress(nbytes, t), _DELIVERY, 0, (what, i, p, v))
    return Flow(tuple(tuple(row) for row in done))
