"""Gossip graphs, their mixing matrices and consensus distance (pure numpy, no Ray).

Decentralised SGD has no server and no global sum: worker i only ever talks to its neighbours
N(i) in an undirected graph, and after every local SGD step replaces its parameters by a
weighted average of its own and its neighbours' (row i of the mixing matrix W):

    x_i <- W_ii x_i + sum_{j in N(i)} W_ij x_j

Graphs (N = 8 shown; every edge is two-way):

    ring          i -- i+1 (mod N)                      d = 2           0-1-2-3-4-5-6-7-(0)
    torus         R x C grid with wrap-around, R the    d = 4           0-1-2-3   row i*C..i*C+C-1
                  largest divisor of N <= sqrt(N)                       | | | |   (N = 8: 2 x 4,
                                                                        4-5-6-7    so d = 3)
    exponential   i -- i +- 2^k (mod N) for 2^k < N     d ~ 2 log2 N    0: 1, 7, 2, 6, 4
    complete      everyone                              d = N-1

Neighbours that coincide (ring with N = 2, a torus side of 1 or 2) are counted once, so
d = |N(i)| is the number of distinct peers a worker really sends to.

Mixing matrix: Metropolis-Hastings weights W_ij = 1 / (1 + max(d_i, d_j)) for j in N(i),
W_ii = 1 - sum_j W_ij. W is symmetric and doubly stochastic, so mixing keeps the average of the
replicas exactly and, on a connected graph, drives every replica to it geometrically: the
consensus distance shrinks by at least |lambda_2(W)| per round (the spectral gap is
1 - |lambda_2|). On a regular graph every weight is 1/(d+1); on the complete graph W = 11^T/N,
so one round makes every replica the exact average -- gossip then equals synchronous SGD.

Cost: per step each worker sends its K-byte model to each of its d neighbours, d*K bytes; in
the alpha-beta model the d copies leave one egress back to back: a + d K / B.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "TOPOLOGIES",
    "consensus_distance",
    "degree",
    "mix",
    "mixing_matrix",
    "mixing_row",
    "neighbours",
    "pairwise_partner",
    "spectral_gap",
    "torus_shape",
]

TOPOLOGIES = ("ring", "torus", "exponential", "complete")


def _check(topology: str, n: int) -> None:
    if topology not in TOPOLOGIES:
        raise ValueError(f"topology {topology!r}: unknown; use one of {', '.join(TOPOLOGIES)}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"workers {n!r}: must be an integer >= 1; e.g. 8")


def torus_shape(n: int) -> tuple[int, int]:
    """Return (rows, cols) with rows the largest divisor of n that is <= sqrt(n)."""
    rows = max(r for r in range(1, math.isqrt(n) + 1) if n % r == 0)
    return rows, n // rows


def _raw(topology: str, i: int, n: int) -> list[int]:
    if topology == "ring":
        return [(i - 1) % n, (i + 1) % n]
    if topology == "complete":
        return list(range(n))
    if topology == "exponential":
        out, step = [], 1
        while step < n:
            out += [(i + step) % n, (i - step) % n]
            step *= 2
        return out
    rows, cols = torus_shape(n)
    r, c = divmod(i, cols)
    return [((r - 1) % rows) * cols + c, ((r + 1) % rows) * cols + c,
            r * cols + (c - 1) % cols, r * cols + (c + 1) % cols]


def neighbours(topology: str, n: int) -> list[list[int]]:
    """Return each worker's distinct neighbours (never itself), in the order it sends to them.

    Send order is by offset -- (j - i) mod N, or the torus direction -- the same for every
    worker, so in each send slot every worker receives exactly one model and no ingress queue
    holds two: the d sends then take d K/B, the cost model's a + d K/B.
    """
    _check(topology, n)
    out = []
    for i in range(n):
        distinct = [j for j in dict.fromkeys(_raw(topology, i, n)) if j != i]
        out.append(distinct if topology == "torus" else sorted(distinct, key=lambda j, i=i: (j - i) % n))
    return out


def degree(topology: str, n: int) -> int:
    """Return the largest number of distinct neighbours of any worker (d in d*K bytes)."""
    return max(len(x) for x in neighbours(topology, n))


def mixing_row(rank: int, nbrs: list[list[int]]) -> dict[int, float]:
    """Return row `rank` of the Metropolis-Hastings matrix as {worker: weight}, self included."""
    d = len(nbrs[rank])
    row = {j: 1.0 / (1 + max(d, len(nbrs[j]))) for j in nbrs[rank]}
    row[rank] = 1.0 - sum(row.values())
    return dict(sorted(row.items()))  # sum in rank order: identical rounding on every worker


def mixing_matrix(nbrs: list[list[int]]) -> np.ndarray:
    """Return the N x N Metropolis-Hastings mixing matrix (symmetric, doubly stochastic)."""
    n = len(nbrs)
    w = np.zeros((n, n))
    for i in range(n):
        for j, v in mixing_row(i, nbrs).items():
            w[i, j] = v
    return w


def mix(row: dict[int, float], values: dict[int, np.ndarray]) -> np.ndarray:
    """One worker's mixing step: sum_j W_ij x_j in float32, in rank order (as mixing_row)."""
    out = None
    for j, w in row.items():
        term = np.float32(w) * np.asarray(values[j], np.float32)
        out = term if out is None else out + term
    return out


def spectral_gap(w: np.ndarray) -> float:
    """Return 1 - |lambda_2(W)|: the fraction of disagreement one mixing round removes."""
    eig = np.sort(np.abs(np.linalg.eigvalsh(w)))[::-1]
    return 1.0 - (float(eig[1]) if len(eig) > 1 else 0.0)


def consensus_distance(replicas: list[np.ndarray] | np.ndarray) -> float:
    """Return the mean L2 distance of the replicas from their average."""
    rows = list(replicas)
    mean = np.zeros(np.shape(rows[0]), np.float64)
    for x in rows:  # one replica at a time in float64: N replicas of a large model never all widen at once
        mean += x
    mean /= len(rows)
    return float(np.mean([np.linalg.norm(np.asarray(x, np.float64) - mean) for x in rows]))


def pairwise_partner(rank: int, nbrs: list[list[int]], seed: int, iteration: int) -> int | None:
    """Asynchronous gossip: the neighbour `rank` averages with at `iteration` (seeded, uniform)."""
    if not nbrs[rank]:
        return None
    pick = np.random.default_rng([seed, 23, rank, iteration]).integers(len(nbrs[rank]))
    return nbrs[rank][int(pick)]
