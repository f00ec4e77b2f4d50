"""Cut the flat parameters into partitions and place them on servers. Pure.

A *partition* is the unit a parameter server keeps, versions, aggregates and sends on its own
(BytePS calls it a key slice): a worker pushes every partition of its gradient one after another,
and a partition's pull starts as soon as its server has averaged that partition, while the worker
is still pushing later ones. So on full-duplex links a worker's pulls overlap its own pushes, and
one server's replies overlap the others' incoming pushes.

    flat parameters  |p0|p1|p2|p3|p4|p5|p6|p7|      M = 8 partitions of at most P bytes
    servers (S = 3)   s0 s1 s2 s0 s1 s2 s0 s1       partition p on server p mod S

Partitions are equal flat ranges (sizes differ by at most one element), so a large tensor is
split and small neighbours share a partition; P counts logical bytes, the K of the cost model.
There are M = max(S, ceil(K / P)) of them (each server holds at least one), at most one per
element. P = 0 turns partitioning off: one partition per server, the balanced slices of a plain
sharded parameter server.

Round-robin placement balances bytes (servers differ by at most one partition) and makes
consecutive pushes of one worker go to different servers, so every server's link is busy from
the start of a step instead of the servers taking turns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from testbed.util.split import chunk_bounds

MiB = 2**20


@dataclass(frozen=True)
class Partitioning:
    """Where each partition lives: flat ranges `bounds[p]` on server `server_of[p]`."""

    bounds: tuple[tuple[int, int], ...]
    server_of: tuple[int, ...]
    servers: int

    @property
    def count(self) -> int:
        return len(self.bounds)

    def on_server(self, s: int) -> list[int]:
        """The partitions server s holds, in push order."""
        return [p for p, owner in enumerate(self.server_of) if owner == s]

    def logical_bytes(self, factor: float) -> list[int]:
        """Each partition's bytes on the wire: its float32 elements times the workload's logical
        factor (logical bytes per physical byte)."""
        return [int((hi - lo) * 4 * factor) for lo, hi in self.bounds]


def partition_count(logical_bytes: float, partition_mb: float, servers: int, numel: int) -> int:
    """M = max(S, ceil(K / P)), at most numel; S when P = 0 (partitioning off)."""
    if servers < 1:
        raise ValueError(f"servers {servers!r}: must be >= 1")
    if partition_mb < 0 or not math.isfinite(partition_mb):
        raise ValueError(f"partition_mb {partition_mb!r}: must be finite and >= 0")
    wanted = servers if partition_mb == 0 else max(servers, math.ceil(logical_bytes / (partition_mb * MiB)))
    return max(1, min(wanted, numel))


def partition(numel: int, logical_bytes: float, partition_mb: float, servers: int) -> Partitioning:
    """Equal flat partitions, M = partition_count(...), dealt round-robin to S servers."""
    m = partition_count(logical_bytes, partition_mb, servers, numel)
    return Partitioning(tuple(chunk_bounds(numel, m)), tuple(p % servers for p in range(m)), servers)
