"""Predict per-step communication time of each strategy with the alpha-beta model.

Symbols: K gradient bytes, N workers, S parameter-server shards, a one-way latency (s),
B per-NIC bandwidth (bytes/s). One synchronous step, no overlap of compute and
communication; the NIC model is the one in ``testbed.network`` (each endpoint has one
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

Pipelined variants (what the emulator and a full-duplex network do with zero compute):
``ps-sync 2a + (N + 2S - 1) K/(S B)`` and ``mapreduce 2a + (N + 1) K/B``. Egress and ingress
are separate queues, so the first worker's push overlaps the later workers' pulls: shard s
delivers worker i's pull at a + (i + S) K/(S B) (its S pieces serialise at the worker's
ingress), the worker's S pushes leave one after another and the last reaches its shard
a + S K/(S B) later; the last worker (i = N-1) ends the step. With S = 1 this is
2a + (N+1) K/B, the same as the driver of MapReduce. The no-overlap formulas above are the
upper bounds every step respects; `predict` reports both.

Halving-doubling (Rabenseifner): ``2 log2(N) a + 2 (N-1)/N K/B``. Recursive halving does
log2 N rounds exchanging K/2, K/4, ..., K/N bytes, which sum to (N-1)/N K; recursive
doubling mirrors it. For N not a power of two ceil(log2 N) rounds are charged, an
approximation that ignores the extra fold-in step.

Gossip with d neighbours: ``a + d K/B``. A worker sends its K-byte model to each of d
neighbours through one egress (d K/B) and pays one latency; with d = 0 nothing moves.

Asynchronous parameter server: ``2(a + K/(S B))`` per applied gradient -- one worker's own
push and pull round trip through one shard's NIC with no other worker queued ahead of it.
Contention from the other N-1 workers can only add to this, so it is a lower bound.
"""

from __future__ import annotations

import math

__all__ = [
    "STRATEGIES",
    "bytes_per_worker_per_step",
    "gossip_comm_s",
    "halving_doubling_comm_s",
    "mapreduce_comm_s",
    "mapreduce_pipelined_comm_s",
    "predict",
    "ps_async_comm_s",
    "ps_sync_comm_s",
    "ps_sync_pipelined_comm_s",
    "ring_comm_s",
]

STRATEGIES = (
    "ring",
    "allreduce-torch",
    "ps-sync",
    "ps-async",
    "mapreduce",
    "halving-doubling",
    "gossip",
)


def _count(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"{name} {value!r}: must be an integer >= {minimum}; e.g. {max(minimum, 4)}"
        )
    return value


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


def ps_sync_comm_s(n: int, k: float, a: float, b: float, shards: int = 1) -> float:
    """Return 2(a + N K/(S B))."""
    _count("workers", n, 1)
    _count("shards", shards, 1)
    _link(k, a, b)
    # Push then pull; each moves N*K/S bytes through one shard NIC queue.
    return 2 * (a + n * k / (shards * b))


def mapreduce_comm_s(n: int, k: float, a: float, b: float) -> float:
    """Return 2(a + N K/B)."""
    _count("workers", n, 1)
    _link(k, a, b)
    # Broadcast N*K out of the driver's egress, then gather N*K into its ingress.
    return 2 * (a + n * k / b)


def halving_doubling_comm_s(n: int, k: float, a: float, b: float) -> float:
    """Return 2 ceil(log2 N) a + 2 (N-1)/N K/B."""
    _count("workers", n, 1)
    _link(k, a, b)
    # (n-1).bit_length() == ceil(log2 n) exactly, with no floating-point log.
    rounds = (n - 1).bit_length()
    return 2 * rounds * a + 2 * (n - 1) / n * k / b


def gossip_comm_s(d: int, k: float, a: float, b: float) -> float:
    """Return a + d K/B (0 with no neighbours)."""
    _count("degree", d, 0)
    _link(k, a, b)
    if d == 0:
        return 0.0
    # d copies of the model leave through one egress; one latency for the last to land.
    return a + d * k / b


def ps_sync_pipelined_comm_s(n: int, k: float, a: float, b: float, shards: int = 1) -> float:
    """Return 2a + (N + 2S - 1) K/(S B): pulls and pushes overlap on full-duplex NICs."""
    _count("workers", n, 1)
    _count("shards", shards, 1)
    _link(k, a, b)
    return 2 * a + (n + 2 * shards - 1) * k / (shards * b)


def mapreduce_pipelined_comm_s(n: int, k: float, a: float, b: float) -> float:
    """Return 2a + (N + 1) K/B: the driver's broadcast and gather overlap."""
    _count("workers", n, 1)
    _link(k, a, b)
    return 2 * a + (n + 1) * k / b


def ps_async_comm_s(n: int, k: float, a: float, b: float, shards: int = 1) -> float:
    """Return the lower bound 2(a + K/(S B)) per applied gradient; N only validated."""
    _count("workers", n, 1)
    _count("shards", shards, 1)
    _link(k, a, b)
    # One push of K/S bytes to a shard and one pull back, with nobody queued ahead.
    return 2 * (a + k / (shards * b))


def _strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r}: unknown; use one of {', '.join(STRATEGIES)}")
    return strategy


def predict(
    strategy: str,
    *,
    workers: int,
    grad_bytes: float,
    latency: float,
    bandwidth: float,
    shards: int = 1,
    buckets: int = 1,
    compute_s: float = 0.0,
    degree: int = 2,
) -> dict[str, float | str]:
    """Return predicted_comm_s, predicted_step_s (= compute_s + comm) and the formula."""
    _strategy(strategy)
    if not (math.isfinite(compute_s) and compute_s >= 0):
        raise ValueError(f"compute_s {compute_s!r}: must be finite and >= 0 seconds; e.g. 0.05")
    n, k, a, b = workers, grad_bytes, latency, bandwidth
    upper = None
    if strategy in ("ring", "allreduce-torch"):
        comm = ring_comm_s(n, k, a, b, buckets=buckets)
        formula = "2*(N-1)*(a + K/(N*B))" if buckets == 1 else "2*(N-1)*(b*a + K/(N*B))"
    elif strategy == "ps-sync":
        comm, formula = ps_sync_pipelined_comm_s(n, k, a, b, shards), "2*a + (N+2*S-1)*K/(S*B) (pipelined)"
        upper = ps_sync_comm_s(n, k, a, b, shards=shards)
    elif strategy == "ps-async":
        comm = ps_async_comm_s(n, k, a, b, shards=shards)
        formula = "2*(a + K/(S*B)) (lower bound, no contention)"
    elif strategy == "mapreduce":
        comm, formula = mapreduce_pipelined_comm_s(n, k, a, b), "2*a + (N+1)*K/B (pipelined)"
        upper = mapreduce_comm_s(n, k, a, b)
    elif strategy == "halving-doubling":
        comm = halving_doubling_comm_s(n, k, a, b)
        formula = "2*ceil(log2(N))*a + 2*(N-1)/N*K/B"
    else:
        _count("workers", n, 1)
        # A worker cannot have more distinct neighbours than there are other workers.
        comm, formula = gossip_comm_s(min(degree, n - 1), k, a, b), "a + d*K/B"
    return {"predicted_comm_s": comm, "predicted_step_s": compute_s + comm, "formula": formula,
            "predicted_comm_s_no_overlap": comm if upper is None else upper}


def bytes_per_worker_per_step(
    strategy: str, workers: int, grad_bytes: float, shards: int = 1, degree: int = 2
) -> float:
    """Return the bytes one worker sends per step under STRATEGY."""
    _strategy(strategy)
    _count("workers", workers, 1)
    _count("shards", shards, 1)
    _link(grad_bytes, 0.0, 1.0)
    n, k = workers, grad_bytes
    if strategy in ("ring", "allreduce-torch", "halving-doubling"):
        # Reduce-scatter and allgather each send (N-1) chunks of K/N bytes.
        return 2 * k * (n - 1) / n
    if strategy == "gossip":
        return min(_count("degree", degree, 0), n - 1) * k
    # PS: K/S to each of S shards; MapReduce: one K-byte gradient to the driver.
    return float(k)
