"""Allreduce algorithms as pure message schedules, with a single-process reference executor.

A schedule is, for one rank, a list of rounds; in a round the rank first sends element ranges
of its buffer to some peers, then receives ranges from peers and adds them in (reduce) or
copies them over (gather). Every rank has the same number of rounds (idle ones are empty), so
(bucket, round, sender) names a message uniquely. `simulate` runs all ranks' schedules in one
process and checks that every send meets its receive; the actor shell (`peer.run_schedule`)
runs one rank's schedule over a transport. Sends read the buffer as it was before the round's
receives (no schedule sends and receives overlapping ranges in one round).
K = buffer bytes, N ranks, a latency, B bandwidth; costs are per allreduce, no contention.

Ring (`ring.py`): 2(N-1) rounds of K/N bytes -> 2(N-1)(a + K/(N B)).

Halving-doubling (Rabenseifner), p = largest power of two <= N, the N-p extra ranks folded in:

    fold       rank p+i sends its whole buffer to rank i, which adds it       (if N > p)
    halving    log2 p rounds; mask m = p/2, p/4, ..., 1: rank v swaps halves of its current
               segment with v XOR m, keeps (and adds into) the lower half if v & m == 0
               -> rank v owns chunk v of p, fully reduced (a reduce-scatter)
    doubling   log2 p rounds, m = 1, 2, ..., p/2: send own segment to v XOR m, receive its
               sibling segment -> every rank of the p holds the sum (an allgather)
    unfold     rank i sends the result back to rank p+i                        (if N > p)

    p = 4: halving m=2: 0<->2, 1<->3 swap halves (K/2); m=1: 0<->1, 2<->3 swap quarters (K/4)
           doubling m=1: 0<->1, 2<->3 swap quarters; m=2: 0<->2, 1<->3 swap halves

Cost 2 log2(p) a + 2 (p-1)/p K/B, plus 2(a + K/B) for the fold when N is not a power of two:
latency-optimal (log rounds) and bandwidth-optimal for powers of two.

Binomial tree: reduce to rank 0, then broadcast from it, each ceil(log2 N) rounds of the
whole buffer. Reduce round m = 1, 2, 4, ...: ranks with v & (m-1) == 0 pair up; v with v & m
sends to v - m and drops out. Broadcast mirrors it (m descending, v -> v + m)::

    N = 8 reduce:  m=1: 1->0 3->2 5->4 7->6   m=2: 2->0 6->4   m=4: 4->0
    broadcast:     m=4: 0->4                  m=2: 0->2 4->6   m=1: 0->1 2->3 4->5 6->7

Cost 2 ceil(log2 N)(a + K/B): few rounds, but the whole buffer on every hop.

Hierarchical (node-aware): the ranks of a node form a group whose first rank leads it.

    1. reduce within each group to its leader (binomial tree, ceil(log2 g) rounds)
    2. ring allreduce across the M leaders (2(M-1) rounds of K/M)
    3. broadcast within each group from its leader (binomial tree)

Cost 2 ceil(log2 g)(a + K/B) + 2(M-1)(a + K/(M B)), g the largest group: on real hardware
intra-node links (shared memory, NVLink) are much faster than the network, so only step 2
pays network prices. The emulator gives every worker the same NIC, so it charges all three.

Every algorithm moves 2(N-1)K bytes in total per allreduce (N = power of two for
halving-doubling); they differ in how many rounds pay latency and in how evenly the bytes
spread over the NICs.

`ALGORITHMS` is the one table of them: per name its schedule, its cost (the formulas live in
`testbed.analysis.costmodel`), the formula text a prediction shows, and what the rest of the
testbed asks of it (which message path it takes, whether it needs node groups). Adding an
algorithm is one entry there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from testbed.allreduce.ring import allgather_schedule, chunk_bounds, scatter_reduce_schedule
from testbed.analysis import costmodel

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "Round",
    "Transfer",
    "bytes_moved",
    "groups_from_nodes",
    "groups_of_size",
    "halving_doubling_schedule",
    "hierarchical_schedule",
    "lookup",
    "reference_allreduce",
    "ring_rounds",
    "schedule",
    "simulate",
    "tree_broadcast_rounds",
    "tree_reduce_rounds",
    "tree_schedule",
]

@dataclass(frozen=True)
class Transfer:
    peer: int
    lo: int  # element range [lo, hi) of the buffer
    hi: int
    add: bool = True  # receives only: add into the buffer (reduce) or overwrite it (gather)


@dataclass(frozen=True)
class Round:
    sends: tuple[Transfer, ...] = ()
    recvs: tuple[Transfer, ...] = ()


def _round(sends: list[Transfer], recvs: list[Transfer]) -> Round:
    """Drop empty ranges: both ends compute the same ranges, so both drop the same message."""
    return Round(tuple(t for t in sends if t.hi > t.lo), tuple(t for t in recvs if t.hi > t.lo))


def _pad(rounds: list[Round], total: int) -> list[Round]:
    return rounds + [Round()] * (total - len(rounds))


def _log2ceil(n: int) -> int:
    return (n - 1).bit_length()


# ---------------------------------------------------------------- building blocks


def tree_reduce_rounds(members: Sequence[int], rank: int, length: int) -> list[Round]:
    """Binomial-tree sum of the whole buffer onto members[0]; ceil(log2 m) rounds."""
    m, v = len(members), list(members).index(rank)
    rounds, mask = [], 1
    while mask < m:
        sends, recvs = [], []
        if v & (mask - 1) == 0:  # still active
            if v & mask:
                sends.append(Transfer(members[v - mask], 0, length))
            elif v + mask < m:
                recvs.append(Transfer(members[v + mask], 0, length, add=True))
        rounds.append(_round(sends, recvs))
        mask *= 2
    return rounds


def tree_broadcast_rounds(members: Sequence[int], rank: int, length: int) -> list[Round]:
    """Binomial-tree copy of members[0]'s buffer to every member; ceil(log2 m) rounds."""
    m, v = len(members), list(members).index(rank)
    rounds = []
    for j in reversed(range(_log2ceil(m))):
        mask = 1 << j
        sends, recvs = [], []
        low = v & (2 * mask - 1)
        if low == 0 and v + mask < m:
            sends.append(Transfer(members[v + mask], 0, length))
        elif low == mask:
            recvs.append(Transfer(members[v - mask], 0, length, add=False))
        rounds.append(_round(sends, recvs))
    return rounds


def ring_rounds(members: Sequence[int], rank: int, length: int) -> list[Round]:
    """ring.py's scatter-reduce + allgather among `members`, as 2(m-1) rounds."""
    m, pos = len(members), list(members).index(rank)
    bounds = chunk_bounds(length, m)
    right, left = members[(pos + 1) % m], members[(pos - 1) % m]
    rounds = []
    for sched, add in ((scatter_reduce_schedule(pos, m), True), (allgather_schedule(pos, m), False)):
        for s, r in sched:
            rounds.append(_round([Transfer(right, *bounds[s])], [Transfer(left, *bounds[r], add=add)]))
    return rounds


# ---------------------------------------------------------------- algorithms


def halving_doubling_schedule(rank: int, n: int, length: int) -> list[Round]:
    """Rabenseifner's reduce-scatter + allgather; extra ranks beyond 2^k are folded in."""
    p = 1 << (n.bit_length() - 1)
    extra, steps = n - p, p.bit_length() - 1
    rounds: list[Round] = []
    if extra:
        if rank >= p:
            rounds.append(_round([Transfer(rank - p, 0, length)], []))
        else:
            rounds.append(_round([], [Transfer(rank + p, 0, length)] if rank < extra else []))
    if rank < p:
        rounds += _halving_doubling_core(rank, p, length)
    else:
        rounds += [Round()] * (2 * steps)
    if extra:
        if rank >= p:
            rounds.append(_round([], [Transfer(rank - p, 0, length, add=False)]))
        else:
            rounds.append(_round([Transfer(rank + p, 0, length)] if rank < extra else [], []))
    return rounds


def _halving_doubling_core(v: int, p: int, length: int) -> list[Round]:
    bounds = chunk_bounds(length, p)

    def span(c0: int, c1: int) -> tuple[int, int]:
        return bounds[c0][0], bounds[c1 - 1][1]

    rounds, (c0, c1), mask = [], (0, p), p // 2
    while mask:  # recursive halving: keep one half of the segment, add the partner's copy of it
        mid = (c0 + c1) // 2
        keep, give = ((c0, mid), (mid, c1)) if v & mask == 0 else ((mid, c1), (c0, mid))
        rounds.append(_round([Transfer(v ^ mask, *span(*give))],
                             [Transfer(v ^ mask, *span(*keep), add=True)]))
        (c0, c1), mask = keep, mask // 2
    mask = 1
    while mask < p:  # recursive doubling: swap segments with the partner, both grow
        size = c1 - c0
        other = (c0 - size, c0) if v & mask else (c1, c1 + size)
        rounds.append(_round([Transfer(v ^ mask, *span(c0, c1))],
                             [Transfer(v ^ mask, *span(*other), add=False)]))
        c0, c1, mask = min(c0, other[0]), max(c1, other[1]), mask * 2
    return rounds


def tree_schedule(rank: int, n: int, length: int) -> list[Round]:
    """Binomial-tree reduce to rank 0, then binomial-tree broadcast from it."""
    members = list(range(n))
    return tree_reduce_rounds(members, rank, length) + tree_broadcast_rounds(members, rank, length)


def hierarchical_schedule(rank: int, groups: Sequence[Sequence[int]], length: int) -> list[Round]:
    """Reduce within the group, ring across group leaders, broadcast within the group."""
    mine = next(g for g in groups if rank in g)
    depth = max(_log2ceil(len(g)) for g in groups)
    leaders = [g[0] for g in groups]
    across = ring_rounds(leaders, rank, length) if rank in leaders else []
    return (_pad(tree_reduce_rounds(mine, rank, length), depth)
            + _pad(across, 2 * (len(groups) - 1))
            + _pad(tree_broadcast_rounds(mine, rank, length), depth))


# ---------------------------------------------------------------- the table

Schedule = Callable[[int, int, int, Sequence[Sequence[int]] | None], list[Round]]
Cost = Callable[[int, float, float, float, int, int | None, int | None], float]


@dataclass(frozen=True)
class Algorithm:
    """One allreduce algorithm: everything the testbed needs to know of it."""

    name: str
    schedule: Schedule  # (rank, n, length, groups) -> that rank's rounds
    cost: Cost  # (n, K, a, B, buckets, node_size, nodes) -> seconds per allreduce, alpha-beta
    formula: str  # the cost as a prediction shows it; "(a + " becomes "(b*a + " with b buckets
    # over the object store: "channel" (shared-memory channel to the right neighbour, the
    # ring's own exchange) or "call" (an actor call to any peer, `collectives.run_schedule`)
    message_path: str
    # moved by the ring's neighbour exchange (`collectives.ring_allreduce`); top-k compression
    # gathers its sparse pieces over that exchange, so only these algorithms allow it
    neighbour_exchange: bool = False
    needs_groups: bool = False  # the schedule takes node groups (--node-size or Ray nodes)


ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm(
        "ring",
        schedule=lambda rank, n, length, groups: ring_rounds(range(n), rank, length),
        cost=lambda n, k, a, b, buckets, node_size, nodes: costmodel.ring_comm_s(n, k, a, b, buckets=buckets),
        formula="2*(N-1)*(a + K/(N*B))",
        message_path="channel", neighbour_exchange=True),
    Algorithm(
        "halving-doubling",
        schedule=lambda rank, n, length, groups: halving_doubling_schedule(rank, n, length),
        cost=lambda n, k, a, b, buckets, node_size, nodes: costmodel.halving_doubling_folded_comm_s(
            n, k, a, b, buckets=buckets),
        formula="2*log2(p)*a + 2*(p-1)/p*K/B [+ 2*(a + K/B) if N > p = 2^floor(log2 N)]",
        message_path="call"),
    Algorithm(
        "tree",
        schedule=lambda rank, n, length, groups: tree_schedule(rank, n, length),
        cost=lambda n, k, a, b, buckets, node_size, nodes: costmodel.tree_comm_s(n, k, a, b, buckets=buckets),
        formula="2*ceil(log2(N))*(a + K/B)",
        message_path="call"),
    Algorithm(
        "hierarchical",
        schedule=lambda rank, n, length, groups: hierarchical_schedule(rank, groups, length),
        cost=lambda n, k, a, b, buckets, node_size, nodes: costmodel.hierarchical_comm_s(
            n, k, a, b, node_size, buckets=buckets, nodes=nodes),
        formula="2*ceil(log2(g))*(a + K/B) + 2*(M-1)*(a + K/(M*B))",
        message_path="call", needs_groups=True),
)}


def lookup(algorithm: str) -> Algorithm:
    """The table's entry for `algorithm`; ValueError naming the choices if there is none."""
    try:
        return ALGORITHMS[algorithm]
    except KeyError:
        raise ValueError(f"algorithm {algorithm!r}: unknown; use one of {', '.join(ALGORITHMS)}") from None


def schedule(algorithm: str, rank: int, n: int, length: int,
             groups: Sequence[Sequence[int]] | None = None) -> list[Round]:
    """One rank's rounds for `algorithm` (one that needs groups takes `groups`, a partition of 0..n-1)."""
    if not 0 <= rank < n:
        raise ValueError(f"rank {rank}: must be in [0, {n}); n is the number of workers")
    entry = lookup(algorithm)
    if entry.needs_groups:
        _check_groups(groups, n)
    return entry.schedule(rank, n, length, groups)


# ---------------------------------------------------------------- node groups


def _check_groups(groups: Sequence[Sequence[int]] | None, n: int) -> None:
    flat = sorted(r for g in groups or [] for r in g)
    if flat != list(range(n)) or any(len(g) == 0 for g in groups or []):
        raise ValueError(f"groups {groups!r}: must partition ranks 0..{n - 1} into non-empty groups")


def groups_of_size(n: int, size: int) -> list[list[int]]:
    """Emulated nodes: consecutive ranks, `size` per node (the last node may be smaller)."""
    if size < 1:
        raise ValueError(f"node size {size}: must be >= 1, e.g. 4")
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)]


def groups_from_nodes(node_ids: Sequence[str]) -> list[list[int]]:
    """Real nodes: ranks grouped by the node they run on, groups ordered by their first rank."""
    groups: dict[str, list[int]] = {}
    for rank, node in enumerate(node_ids):
        groups.setdefault(node, []).append(rank)
    return list(groups.values())


# ---------------------------------------------------------------- reference execution


def bytes_moved(rounds: Sequence[Round], itemsize: int) -> tuple[int, int]:
    """(bytes sent, bytes received) by one rank over its schedule."""
    sent = sum(t.hi - t.lo for r in rounds for t in r.sends)
    recv = sum(t.hi - t.lo for r in rounds for t in r.recvs)
    return sent * itemsize, recv * itemsize


def simulate(buffers: Sequence[np.ndarray], schedules: Sequence[Sequence[Round]],
             wire: Callable[[np.ndarray], np.ndarray] | None = None) -> list[np.ndarray]:
    """Run every rank's schedule in one process; return new buffers.

    `wire` maps each payload (e.g. `lambda x: x.astype(np.float16)`) and, at the end, every
    result, as `collectives.run_schedule` does. Raises ValueError if a send misses its receive.
    """
    bufs = [np.array(b, copy=True) for b in buffers]
    total = max((len(s) for s in schedules), default=0)
    if any(len(s) != total for s in schedules):
        raise ValueError("schedules differ in length; every rank must have the same rounds")
    for t in range(total):
        inflight: dict[tuple[int, int], tuple[int, int, np.ndarray]] = {}
        for src, sched in enumerate(schedules):
            for tr in sched[t].sends:
                if (src, tr.peer) in inflight:
                    raise ValueError(f"round {t}: rank {src} sends twice to {tr.peer}")
                data = bufs[src][tr.lo:tr.hi].copy()
                inflight[(src, tr.peer)] = (tr.lo, tr.hi, wire(data) if wire else data)
        for dst, sched in enumerate(schedules):
            for tr in sched[t].recvs:
                lo, hi, data = inflight.pop((tr.peer, dst), (None, None, None))
                if (lo, hi) != (tr.lo, tr.hi):
                    raise ValueError(f"round {t}: rank {dst} expects [{tr.lo},{tr.hi}) from "
                                     f"{tr.peer}, which sent {lo, hi}")
                if tr.add:
                    bufs[dst][lo:hi] += data.astype(bufs[dst].dtype)
                else:
                    bufs[dst][lo:hi] = data
        if inflight:
            raise ValueError(f"round {t}: messages {sorted(inflight)} were never received")
    if wire is not None and total:  # as the actors do: every replica ends with the wire's values
        for b in bufs:
            b[:] = wire(b)
    return bufs


def reference_allreduce(buffers: Sequence[np.ndarray], algorithm: str,
                        groups: Sequence[Sequence[int]] | None = None) -> list[np.ndarray]:
    """Sum 1-D buffers by `algorithm`, simulated message by message; one result per rank."""
    n, length = len(buffers), len(buffers[0])
    return simulate(buffers, [schedule(algorithm, r, n, length, groups) for r in range(n)])
