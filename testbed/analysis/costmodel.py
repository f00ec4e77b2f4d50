"""The alpha-beta cost model: communication time per step, one pure function per schedule.

Each strategy's spec (`<package>/spec.py`) composes these into its prediction; nothing here
knows strategy names.

Symbols: K gradient bytes, N workers, S parameter-server shards, a one-way latency (s),
B per-NIC bandwidth (bytes/s). One synchronous step, no overlap of compute and
communication; the NIC model is the one in ``testbed.emulation.network`` (each endpoint has one
egress and one ingress queue of bandwidth B, so traffic into one NIC serialises).

Ring allreduce: ``2(N-1)(a + K/(N B))``. The gradient is cut into N chunks of K/N bytes.
Reduce-scatter takes N-1 rounds and allgather another N-1; in every round each worker
sends one chunk to its successor and receives one from its predecessor, so no NIC carries
more than one message per round and a round costs a + K/(N B). With b buckets reduced one
after another each round is paid per bucket: latency b*a per round, while the bytes per
round still add up to K/(N B), giving ``2(N-1)(b a + K/(N B))``. N = 1 needs no traffic.

Synchronous parameter server: ``2(a + N K/(S B))``. Each worker pushes K/S bytes to each
of S shards; a shard's ingress receives N*K/S bytes, which serialise, so the push phase
ends a + N K/(S B) after it starts. The pull is symmetric: N*K/S bytes leave each shard's
egress. Worker egress (K/B) is hidden because N >= S in any sensible setup.

MapReduce-style driver aggregation: ``2(a + N K/B)``. The driver is a single NIC: it
sends K bytes of parameters to each of N workers (N K through its egress) and receives N
gradients of K bytes (N K through its ingress); each phase adds one latency.

Pipelined MapReduce (what the emulator and a full-duplex network do with zero compute):
``2a + (N + 1) K/B``. Egress and ingress are separate queues, so the first worker's push
overlaps the later workers' pulls: the driver delivers worker i's parameters at a + (i + 1) K/B,
the worker's gradient reaches the driver a + K/B later, and the last worker (i = N-1) ends the
step. The no-overlap formula above is the upper bound every step respects; the spec reports
both. (The parameter server pipelines differently -- push-pull per partition, ``psmodel``.)

Compressed pushes (``--compression`` on MapReduce): a worker pushes P bytes (P = K/2 for fp16,
about 2 F K for top-k) while parameters still travel as K. Worker i's parameters land at
a + (i + 1) K/B as above and its push P/B + a later; consecutive workers' pushes reach the
driver K/B apart and each holds its ingress only P/B <= K/B, so they never queue:
``2a + N K/B + P/B``; the no-overlap bound becomes ``2a + N (K + P)/B``.

Halving-doubling (Rabenseifner): ``2 log2(N) a + 2 (N-1)/N K/B``. Recursive halving does
log2 N rounds exchanging K/2, K/4, ..., K/N bytes, which sum to (N-1)/N K; recursive
doubling mirrors it. `halving_doubling_comm_s` charges ceil(log2 N) rounds for N not a power
of two (the textbook approximation); `halving_doubling_folded_comm_s` is exact for the
schedule in ``testbed.allreduce.algorithms``: with p = 2^floor(log2 N), the N-p extra ranks
fold their whole buffer into a partner first and get the result back last,
``2 log2(p) a + 2 (p-1)/p K/B + 2 (a + K/B)`` (the last term only when N > p).

Binomial tree (reduce to rank 0, broadcast back): ``2 ceil(log2 N)(a + K/B)`` -- every round
moves the whole buffer, one message into each receiving NIC. Exact for N a power of two; for
other N an upper bound (a subtree that is done early sends ahead and hides a latency).

Hierarchical (g workers per node, M = ceil(N/g) nodes): tree reduce within the node, ring
across the M node leaders, tree broadcast within the node:
``2 ceil(log2 g)(a + K/B) + 2 (M-1)(a + K/(M B))``. The emulator charges intra-node hops at
network prices too; on real hardware they ride shared memory or NVLink.

Every allreduce above moves 2(N-1)K bytes in total, 2K(N-1)/N per worker on average; with b
buckets reduced one after another each round's latency is paid b times (``b a``).

Compression (``--compression``): fp16 halves K in every formula. Top-k with fraction F sends
k = F K/4 (index, value) pairs, 2 F K bytes, gathered around the ring:
``(N-1)(b a + 2 F K/B)``.

Gossip with d neighbours: ``a + d K/B``. A worker sends its K-byte model to each of d
neighbours through one egress (d K/B) and pays one latency; with d = 0 nothing moves.
Asynchronous gossip averages with one neighbour per iteration: the model goes there and the
neighbour's comes back, ``2(a + K/B)``.

Partitioned parameter server (``--ps-partition-mb``; M partitions, partition p on server p mod S,
servers dedicated or colocated with workers) and the BytePS optimum
``2 n (n-1) K/((n^2 + k n - 2k) B)`` for k CPU-only servers: ``testbed.analysis.psmodel``
(``ps_partitioned_comm_s``, ``ps_async_partitioned_comm_s``, ``byteps_optimal_comm_s``). With dedicated servers the steady-state step there is
``2a + max(s* + 1 + C + N(m-1), M + N) K/(M B)`` (m partitions on the busiest server s*, C its
fill), which is ``2a + (N + S) K/(S B)`` with partitioning off.

Asynchronous parameter server: ``2(a + K/(S B))`` per applied gradient -- one worker's own
push and pull round trip through one shard's NIC with no other worker queued ahead of it
(``2a + (P + K)/(S B)`` with compressed pushes).
Contention from the other N-1 workers can only add to this, so it is a lower bound.
"""

from __future__ import annotations

import math
import numbers

__all__ = [
    "gossip_comm_s",
    "gossip_async_comm_s",
    "halving_doubling_comm_s",
    "halving_doubling_folded_comm_s",
    "hierarchical_comm_s",
    "mapreduce_comm_s",
    "mapreduce_pipelined_comm_s",
    "ps_async_comm_s",
    "ps_sync_comm_s",
    "ring_comm_s",
    "sparse_allgather_comm_s",
    "tree_comm_s",
]

def _count(name: str, value: int, minimum: int) -> int:
    # any integer, numpy's too (a count read back from a table), but not a bool
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(
            f"{name} {value!r}: must be an integer >= {minimum}; e.g. {max(minimum, 4)}"
        )
    return int(value)


class NotModelled(Exception):
    """The cost model has no formula for this run; the message says why (kept in the summary)."""


def _link(k: float, a: float, b: float) -> None:
    if not (math.isfinite(k) and k >= 0):
        raise ValueError(f"grad_bytes {k!r}: must be finite and >= 0; e.g. 4e8")
    if not (math.isfinite(a) and a >= 0):
        raise ValueError(f"latency {a!r}: must be finite and >= 0 seconds; e.g. 5e-5")
    if not (math.isfinite(b) and b > 0):
        raise ValueError(f"bandwidth {b!r}: must be finite and > 0 bytes/s; e.g. 1.25e9")


def ring_comm_s(n: int, k: float, a: float, b: float, buckets: int = 1) -> float:
    """Return 2(N-1)(buckets*a + K/(N B)); 0 for one worker."""
    _count("workers", n, 1)
    _count("buckets", buckets, 1)
    _link(k, a, b)
    # 2(N-1) rounds; each pays one latency per bucket and moves K/N bytes in total.
    return 2 * (n - 1) * (buckets * a + k / (n * b))


def ps_sync_comm_s(n: int, k: float, a: float, b: float, shards: int = 1,
                   push: float | None = None) -> float:
    """Return 2a + N (P + K)/(S B), P = pushed gradient bytes (K unless compressed)."""
    _count("workers", n, 1)
    _count("shards", shards, 1)
    _link(k, a, b)
    p = k if push is None else push
    # Push then pull; each phase moves N gradients (N*P/S) or N parameter slices (N*K/S)
    # through one shard NIC queue.
    return 2 * a + n * (p + k) / (shards * b)


def mapreduce_comm_s(n: int, k: float, a: float, b: float, push: float | None = None) -> float:
    """Return 2a + N (K + P)/B, P = a worker's gradient bytes (K unless compressed)."""
    _count("workers", n, 1)
    _link(k, a, b)
    p = k if push is None else push
    # Broadcast N*K out of the driver's egress, then gather N*P into its ingress.
    return 2 * a + n * (k + p) / b


def halving_doubling_comm_s(n: int, k: float, a: float, b: float) -> float:
    """Return 2 ceil(log2 N) a + 2 (N-1)/N K/B."""
    _count("workers", n, 1)
    _link(k, a, b)
    # (n-1).bit_length() == ceil(log2 n) exactly, with no floating-point log.
    rounds = (n - 1).bit_length()
    return 2 * rounds * a + 2 * (n - 1) / n * k / b


def halving_doubling_folded_comm_s(n: int, k: float, a: float, b: float, buckets: int = 1) -> float:
    """Return 2 log2(p)(b a) + 2 (p-1)/p K/B [+ 2(b a + K/B) if N > p], p = 2^floor(log2 N)."""
    _count("workers", n, 1)
    _count("buckets", buckets, 1)
    _link(k, a, b)
    p = 1 << (n.bit_length() - 1)
    core = 2 * (p.bit_length() - 1) * buckets * a + 2 * (p - 1) / p * k / b
    return core + (2 * (buckets * a + k / b) if n > p else 0.0)


def tree_comm_s(n: int, k: float, a: float, b: float, buckets: int = 1) -> float:
    """Return 2 ceil(log2 N)(b a + K/B): binomial reduce, then binomial broadcast."""
    _count("workers", n, 1)
    _count("buckets", buckets, 1)
    _link(k, a, b)
    return 2 * (n - 1).bit_length() * (buckets * a + k / b)


def hierarchical_comm_s(n: int, k: float, a: float, b: float, node_size: int | None = None,
                        buckets: int = 1, nodes: int | None = None) -> float:
    """Return 2 ceil(log2 g)(b a + K/B) + 2(M-1)(b a + K/(M B)); g = node_size (default N)."""
    _count("workers", n, 1)
    g = min(n, _count("node_size", node_size, 1)) if node_size is not None else n
    m = _count("nodes", nodes, 1) if nodes is not None else -(-n // g)
    _count("buckets", buckets, 1)
    _link(k, a, b)
    # Within a node: a tree of depth ceil(log2 g), twice; across nodes: a ring of M leaders.
    return 2 * (g - 1).bit_length() * (buckets * a + k / b) + 2 * (m - 1) * (buckets * a + k / (m * b))


def sparse_allgather_comm_s(n: int, payload: float, a: float, b: float, buckets: int = 1) -> float:
    """Return (N-1)(b a + P/B): every worker's P-byte top-k payload travels around the ring."""
    _count("workers", n, 1)
    _count("buckets", buckets, 1)
    _link(payload, a, b)
    return (n - 1) * (buckets * a + payload / b)


def gossip_async_comm_s(k: float, a: float, b: float) -> float:
    """Return 2(a + K/B): one pairwise exchange (model out, neighbour's model back)."""
    _link(k, a, b)
    return 2 * (a + k / b)


def gossip_comm_s(d: int, k: float, a: float, b: float) -> float:
    """Return a + d K/B (0 with no neighbours)."""
    _count("degree", d, 0)
    _link(k, a, b)
    if d == 0:
        return 0.0
    # d copies of the model leave through one egress; one latency for the last to land.
    return a + d * k / b


def mapreduce_pipelined_comm_s(n: int, k: float, a: float, b: float, push: float | None = None) -> float:
    """Return 2a + N K/B + P/B: the driver's broadcast and gather overlap ((N + 1) K/B if P = K)."""
    _count("workers", n, 1)
    _link(k, a, b)
    p = k if push is None else push
    return 2 * a + n * k / b + p / b


def ps_async_comm_s(n: int, k: float, a: float, b: float, shards: int = 1,
                    push: float | None = None) -> float:
    """Return the lower bound 2a + (P + K)/(S B) per applied gradient; N only validated."""
    _count("workers", n, 1)
    _count("shards", shards, 1)
    _link(k, a, b)
    p = k if push is None else push
    # One push of P/S bytes to a shard and one pull of K/S back, with nobody queued ahead.
    return 2 * a + (p + k) / (shards * b)


def overlapped_comm_s(forward_s: float, backward_s: float, shares: list[float],
                      bucket_comm_s: list[float]) -> float:
    """Communication left after compute when buckets are allreduced as backward produces them.

    Bucket b (in the order backward finishes them: last layers first) is ready once forward
    and its share of backward are done; the allreduces run one after another on one
    communication thread, each as soon as its bucket is ready and the previous one is done:

        compute  |--- forward ---|======== backward ========|
        ready                        r0        r1            r2 (= end of compute)
        comm                         [ c0 ]    [  c1  ][    c2    ]
                                                                   ^ step ends: compute + exposed

        ready_b = forward + backward * (shares_0 + ... + shares_b)
        end_b   = max(ready_b, end_{b-1}) + c_b,   exposed = end_last - (forward + backward)

    `shares` are the buckets' fractions of backward (by FLOPs under a profile, by elements for
    the plain synthetic gradient), `bucket_comm_s` each bucket's allreduce alone (alpha-beta).
    The no-overlap time is sum(bucket_comm_s); the saving is the difference.
    """
    if len(shares) != len(bucket_comm_s) or not shares:
        raise ValueError(f"one share per bucket: {len(shares)} shares, {len(bucket_comm_s)} buckets")
    end, done = 0.0, forward_s
    for share, c in zip(shares, bucket_comm_s, strict=True):
        done += backward_s * share
        end = max(done, end) + c
    return end - (forward_s + backward_s)
