"""Cut a flat buffer into n near-equal pieces: ring chunks, parameter-server shards. Pure."""

from __future__ import annotations


def chunk_bounds(length: int, n: int) -> list[tuple[int, int]]:
    """Split [0, length) into n half-open chunks whose sizes differ by at most one
    (the first length mod n chunks are one element longer)."""
    if n < 1:
        raise ValueError(f"number of workers n must be >= 1, got {n}")
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    base, extra = divmod(length, n)
    bounds = []
    start = 0
    for c in range(n):
        end = start + base + (1 if c < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds
