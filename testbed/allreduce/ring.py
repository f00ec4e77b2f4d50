"""Ring allreduce: the pure schedule and a single-process reference.

N workers sit on a directed ring; each only talks to its right neighbour.
Every rank's buffer of L elements is cut into N chunks c0..c(N-1)::

        +--------+        +--------+
        | rank 0 | -----> | rank 1 |       buffer: [ c0 | c1 | c2 | c3 ]
        +--------+        +--------+       chunk sizes differ by at most 1
            ^                 |            (the first L mod N get one more)
            |                 v
        +--------+        +--------+
        | rank 3 | <----- | rank 2 |
        +--------+        +--------+

Scatter-reduce (N-1 steps): at step i rank r sends chunk (r-i) mod N to
rank r+1 and receives chunk (r-i-1) mod N from rank r-1, adding it in.
Afterwards rank r holds chunk (r+1) mod N fully reduced.
Allgather (N-1 steps): at step i rank r sends chunk (r+1-i) mod N and
receives chunk (r-i) mod N, overwriting its copy.

Transfers for N=4, written send/recv chunk:

    phase           step   rank0   rank1   rank2   rank3
    scatter-reduce   0      0/3     1/0     2/1     3/2
    scatter-reduce   1      3/2     0/3     1/0     2/1
    scatter-reduce   2      2/1     3/2     0/3     1/0
    (owned chunk)           1       2       3       0
    allgather        0      1/0     2/1     3/2     0/3
    allgather        1      0/3     1/0     2/1     3/2
    allgather        2      3/2     0/3     1/0     2/1

Cost: 2(N-1) steps, each moving one chunk (K/N bytes for a K-byte buffer)
per rank, so every rank sends 2*K*(N-1)/N bytes per allreduce and, in the
alpha-beta model (latency alpha, bandwidth B), the time is
2(N-1) * (alpha + K/(N*B)) -- bandwidth-optimal, independent of N for large K.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from testbed.util.split import chunk_bounds

__all__ = [
    "allgather_schedule",
    "bytes_sent_per_rank",
    "chunk_bounds",
    "ideal_bytes_sent",
    "make_buckets",
    "owned_chunk",
    "reference_allreduce",
    "ring_neighbours",
    "scatter_reduce_schedule",
]

_OPS = ("sum", "mean")


def _check_n(n: int) -> None:
    if n < 1:
        raise ValueError(f"number of workers n must be >= 1, got {n}")


def _check_rank(rank: int, n: int) -> None:
    _check_n(n)
    if not 0 <= rank < n:
        raise ValueError(f"rank must be in [0, {n}), got {rank}")


def ring_neighbours(rank: int, n: int) -> tuple[int, int]:
    """Return (left, right): the rank we receive from and the rank we send to."""
    _check_rank(rank, n)
    return (rank - 1) % n, (rank + 1) % n


def scatter_reduce_schedule(rank: int, n: int) -> list[tuple[int, int]]:
    """Return (send_chunk, recv_chunk) for each of the N-1 scatter-reduce steps."""
    _check_rank(rank, n)
    return [((rank - i) % n, (rank - i - 1) % n) for i in range(n - 1)]


def allgather_schedule(rank: int, n: int) -> list[tuple[int, int]]:
    """Return (send_chunk, recv_chunk) for each of the N-1 allgather steps."""
    _check_rank(rank, n)
    return [((rank + 1 - i) % n, (rank - i) % n) for i in range(n - 1)]


def owned_chunk(rank: int, n: int) -> int:
    """Return the chunk that rank holds fully reduced after scatter-reduce."""
    _check_rank(rank, n)
    return (rank + 1) % n


def bytes_sent_per_rank(length: int, n: int, itemsize: int, rank: int) -> int:
    """Return the exact number of bytes rank sends in one ring allreduce."""
    if itemsize < 1:
        raise ValueError(f"itemsize must be >= 1, got {itemsize}")
    bounds = chunk_bounds(length, n)
    _check_rank(rank, n)
    sends = [s for s, _ in scatter_reduce_schedule(rank, n)]
    sends += [s for s, _ in allgather_schedule(rank, n)]
    return itemsize * sum(bounds[c][1] - bounds[c][0] for c in sends)


def ideal_bytes_sent(length: int, n: int, itemsize: int) -> float:
    """Return 2*L*itemsize*(N-1)/N, the per-rank volume with perfectly even chunks."""
    _check_n(n)
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    return 2.0 * length * itemsize * (n - 1) / n


def _validate_buffers(buffers: Sequence[np.ndarray], op: str) -> None:
    if op not in _OPS:
        raise ValueError(f"op must be one of {_OPS}, got {op!r}")
    if len(buffers) == 0:
        raise ValueError("buffers must be a non-empty list of arrays, got 0 buffers")
    first = buffers[0]
    for r, b in enumerate(buffers):
        if not isinstance(b, np.ndarray):
            raise ValueError(f"buffer {r} is not a numpy array: {type(b).__name__}")
        if b.ndim != 1:
            raise ValueError(f"buffer {r} must be 1-D, got shape {b.shape}")
        if b.shape != first.shape or b.dtype != first.dtype:
            raise ValueError(
                f"buffer {r} has shape {b.shape} dtype {b.dtype}; "
                f"buffer 0 has shape {first.shape} dtype {first.dtype}"
            )
    if not np.issubdtype(first.dtype, np.number):
        raise ValueError(f"buffers must have a numeric dtype, got {first.dtype}")
    if op == "mean" and not np.issubdtype(first.dtype, np.inexact):
        # Integer mean would silently truncate; make the caller choose.
        raise ValueError(f"op='mean' needs a floating dtype, got {first.dtype}")


def _ring_phase(bufs: list[np.ndarray], bounds, schedules, reduce: bool) -> None:
    n = len(bufs)
    for step in range(n - 1):
        # Snapshot every outgoing chunk first: all ranks send at once, so the
        # result must not depend on the order in which we deliver below.
        outgoing = []
        for r in range(n):
            s, e = bounds[schedules[r][step][0]]
            outgoing.append(bufs[r][s:e].copy())
        for r in range(n):
            dst = (r + 1) % n
            recv = schedules[dst][step][1]
            # Schedule invariant: the right neighbour expects what we sent.
            assert recv == schedules[r][step][0]
            s, e = bounds[recv]
            if reduce:
                # In-place add keeps the buffer dtype, so low precision rounds
                # per hop exactly as a real ring would.
                bufs[dst][s:e] += outgoing[r]
            else:
                bufs[dst][s:e] = outgoing[r]


def reference_allreduce(buffers: list[np.ndarray], op: str = "sum") -> list[np.ndarray]:
    """Simulate ring allreduce in one process; return new reduced arrays, one per rank."""
    _validate_buffers(buffers, op)
    n = len(buffers)
    bufs = [np.array(b, copy=True) for b in buffers]
    bounds = chunk_bounds(bufs[0].shape[0], n)
    _ring_phase(bufs, bounds, [scatter_reduce_schedule(r, n) for r in range(n)], True)
    _ring_phase(bufs, bounds, [allgather_schedule(r, n) for r in range(n)], False)
    if op == "mean":
        for b in bufs:
            b /= n
    return bufs


def make_buckets(numels: list[int], bucket_elems: int, first_elems: int | None = None) -> list[list[int]]:
    """Group tensor indices into fused-allreduce buckets, walking in reverse order.

    Backward produces the last layers' gradients first, so bucketing from the
    end lets the first bucket launch while earlier layers are still computing.
    A tensor is never split; one larger than bucket_elems gets its own bucket.
    `first_elems` caps the first bucket lower (as DDP does, 1 MiB), so communication
    starts after the first few tensors rather than after a full bucket.
    """
    if bucket_elems < 1:
        raise ValueError(f"bucket_elems must be >= 1, got {bucket_elems}")
    if first_elems is not None and first_elems < 1:
        raise ValueError(f"first_elems must be >= 1, got {first_elems}")
    for i, k in enumerate(numels):
        if k < 0:
            raise ValueError(f"numels[{i}] must be >= 0, got {k}")
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for idx in reversed(range(len(numels))):
        k = numels[idx]
        cap = min(bucket_elems, first_elems) if first_elems is not None and not buckets else bucket_elems
        if current and size + k > cap:
            buckets.append(current)
            current, size = [], 0
        current.append(idx)
        size += k
    if current:
        buckets.append(current)
    return buckets
