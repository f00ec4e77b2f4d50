"""Unit tests for the pure ring-allreduce schedule and its numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from testbed.allreduce.ring import (
    allgather_schedule,
    bytes_sent_per_rank,
    chunk_bounds,
    ideal_bytes_sent,
    make_buckets,
    owned_chunk,
    reference_allreduce,
    ring_neighbours,
    scatter_reduce_schedule,
)

NS = range(1, 10)
TOL = {
    np.float64: {"rtol": 1e-12, "atol": 1e-12},
    np.float32: {"rtol": 1e-5, "atol": 1e-5},
    # float16 rounds at every hop; |sum| <= 9 and eps(8) ~ 0.008.
    np.float16: {"rtol": 1e-2, "atol": 5e-2},
}


def _inputs(n: int, length: int, dtype, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1.0, 1.0, size=length).astype(dtype) for _ in range(n)]


def _cases():
    for n in NS:
        for length in sorted({0, 1, max(n - 1, 0), n}):
            for dtype in TOL:
                yield n, length, dtype
    for n in (1, 4, 7):
        yield n, 1000003, np.float32


@pytest.mark.parametrize("n,length,dtype", list(_cases()))
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_reference_matches_numpy(n, length, dtype, op):
    bufs = _inputs(n, length, dtype, seed=n * 1000 + length)
    originals = [b.copy() for b in bufs]
    stacked = np.stack(bufs).astype(np.float64)
    expected = stacked.sum(axis=0) if op == "sum" else stacked.mean(axis=0)

    out = reference_allreduce(bufs, op=op)

    assert len(out) == n
    for r, o in enumerate(out):
        assert o.dtype == np.dtype(dtype) and o.shape == (length,)
        np.testing.assert_allclose(o.astype(np.float64), expected, **TOL[dtype])
        # Allgather copies the owner's chunk, so all ranks agree bit for bit.
        np.testing.assert_array_equal(o, out[0])
        assert o is not bufs[r]
    for b, orig in zip(bufs, originals, strict=True):
        np.testing.assert_array_equal(b, orig)


def test_reference_shows_float16_rounding():
    # 2048 + 1 + 1 in float16: the ring adds one hop at a time, so each +1 is
    # lost to rounding (spacing at 2048 is 2); float64 sum gives 2050.
    bufs = [
        np.array([2048.0], np.float16),
        np.array([1.0], np.float16),
        np.array([1.0], np.float16),
    ]
    out = reference_allreduce(bufs)
    assert out[0].dtype == np.float16
    assert float(out[0][0]) != 2050.0


@pytest.mark.parametrize("length", [0, 1, 2, 3, 7, 8, 9, 10, 31, 64, 100, 1001])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 16, 33])
def test_chunk_bounds_cover_and_balance(length, n):
    bounds = chunk_bounds(length, n)
    assert len(bounds) == n
    covered = np.concatenate([np.arange(s, e) for s, e in bounds])
    np.testing.assert_array_equal(covered, np.arange(length))
    sizes = [e - s for s, e in bounds]
    assert max(sizes) - min(sizes) <= 1
    # Independent reference: np.array_split also front-loads the remainder.
    expected = [len(part) for part in np.array_split(np.arange(length), n)]
    assert sizes == expected


@pytest.mark.parametrize("n", NS)
def test_schedules_are_consistent(n):
    for r in range(n):
        left, right = ring_neighbours(r, n)
        assert left == (r - 1) % n and right == (r + 1) % n
        sr, ag = scatter_reduce_schedule(r, n), allgather_schedule(r, n)
        assert len(sr) == len(ag) == n - 1
        sr_left, ag_left = scatter_reduce_schedule(left, n), allgather_schedule(left, n)
        for i in range(n - 1):
            assert sr[i][1] == sr_left[i][0]
            assert ag[i][1] == ag_left[i][0]
        # Allgather starts by forwarding the chunk scatter-reduce finished.
        if n > 1:
            assert ag[0][0] == owned_chunk(r, n)
    for i in range(n - 1):
        # Each step every chunk is sent by exactly one rank.
        assert sorted(scatter_reduce_schedule(r, n)[i][0] for r in range(n)) == list(range(n))
        assert sorted(allgather_schedule(r, n)[i][0] for r in range(n)) == list(range(n))


@pytest.mark.parametrize("n", NS)
def test_owned_chunk_fully_reduced_after_scatter(n):
    length = 5 * n + 3
    bufs = _inputs(n, length, np.float64, seed=n)
    total = np.sum(np.stack(bufs), axis=0)
    bounds = chunk_bounds(length, n)
    work = [b.copy() for b in bufs]
    # Independent step-synchronous simulation of scatter-reduce only.
    for i in range(n - 1):
        msgs = {}
        for r in range(n):
            send, _ = scatter_reduce_schedule(r, n)[i]
            msgs[(r + 1) % n] = work[r][slice(*bounds[send])].copy()
        for r in range(n):
            _, recv = scatter_reduce_schedule(r, n)[i]
            work[r][slice(*bounds[recv])] += msgs[r]
    for r in range(n):
        c = owned_chunk(r, n)
        sl = slice(*bounds[c])
        np.testing.assert_allclose(work[r][sl], total[sl], rtol=1e-12, atol=1e-12)
        if n > 1:
            # A chunk it does not own is not the full sum on this rank.
            other = slice(*bounds[(c + 1) % n])
            assert not np.allclose(work[r][other], total[other])


@pytest.mark.parametrize("length", [0, 1, 3, 8, 17, 1000, 1000003])
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_bytes_sent(length, n, itemsize):
    per_rank = [bytes_sent_per_rank(length, n, itemsize, r) for r in range(n)]
    assert sum(per_rank) == 2 * (n - 1) * length * itemsize
    ideal = ideal_bytes_sent(length, n, itemsize)
    assert ideal == pytest.approx(2 * length * itemsize * (n - 1) / n)
    for b in per_rank:
        assert abs(b - ideal) <= 2 * (n - 1) * itemsize


@pytest.mark.parametrize("itemsize", [1, 4])
def test_bytes_sent_hand_computed(itemsize):
    # L=10, N=4: chunk sizes [3, 3, 2, 2]. Rank r sends every chunk but r+1
    # in scatter-reduce and every chunk but r+2 in allgather.
    per_rank = [bytes_sent_per_rank(10, 4, itemsize, r) for r in range(4)]
    assert per_rank == [15 * itemsize, 16 * itemsize, 15 * itemsize, 14 * itemsize]
    assert bytes_sent_per_rank(10, 1, itemsize, 0) == 0


def test_make_buckets_examples():
    assert make_buckets([], 10) == []
    assert make_buckets([3, 3, 3, 3], 6) == [[3, 2], [1, 0]]
    assert make_buckets([3, 3, 3, 3], 5) == [[3], [2], [1], [0]]
    # Index 1 (50 elems) is bigger than the limit: alone, neighbours not merged.
    assert make_buckets([2, 50, 2, 2], 10) == [[3, 2], [1], [0]]
    assert make_buckets([100], 1) == [[0]]


@pytest.mark.parametrize("seed", range(20))
def test_make_buckets_properties(seed):
    rng = np.random.default_rng(seed)
    numels = [int(x) for x in rng.integers(1, 200, size=int(rng.integers(1, 40)))]
    limit = int(rng.integers(1, 400))
    buckets = make_buckets(numels, limit)
    flat = [i for b in buckets for i in b]
    assert flat == list(reversed(range(len(numels))))
    for b in buckets:
        size = sum(numels[i] for i in b)
        assert size <= limit or len(b) == 1
    for b, nxt in zip(buckets, buckets[1:], strict=False):
        # Greedy: the next tensor really did not fit.
        assert sum(numels[i] for i in b) + numels[nxt[0]] > limit


@pytest.mark.parametrize(
    "call",
    [
        lambda: chunk_bounds(10, 0),
        lambda: chunk_bounds(-1, 2),
        lambda: scatter_reduce_schedule(0, 0),
        lambda: scatter_reduce_schedule(3, 3),
        lambda: allgather_schedule(-1, 3),
        lambda: owned_chunk(5, 2),
        lambda: ring_neighbours(2, 2),
        lambda: bytes_sent_per_rank(10, 2, 0, 0),
        lambda: bytes_sent_per_rank(10, 2, 4, 2),
        lambda: ideal_bytes_sent(-5, 2, 4),
        lambda: make_buckets([1, 2], 0),
        lambda: make_buckets([1, -2], 4),
        lambda: reference_allreduce([]),
        lambda: reference_allreduce([np.zeros(3)], op="max"),
        lambda: reference_allreduce([np.zeros((2, 2))]),
        lambda: reference_allreduce([np.zeros(3), np.zeros(4)]),
        lambda: reference_allreduce([np.zeros(3), np.zeros(3, np.float32)]),
        lambda: reference_allreduce([np.zeros(3, np.int64)], op="mean"),
        lambda: reference_allreduce([[1.0, 2.0]]),
    ],
)
def test_bad_inputs_raise(call):
    with pytest.raises(ValueError):
        call()


def test_error_messages_name_the_value():
    with pytest.raises(ValueError, match="-7"):
        chunk_bounds(-7, 2)
    with pytest.raises(ValueError, match="0"):
        chunk_bounds(5, 0)


def test_the_first_bucket_is_capped_lower_as_in_ddp():
    # last layers first: [3] alone under a cap of 4, then buckets of up to 6 again
    assert make_buckets([3, 3, 3, 3], 6, first_elems=4) == [[3], [2, 1], [0]]
    assert make_buckets([3, 3, 3, 3], 6, first_elems=100) == [[3, 2], [1, 0]]  # never above the cap
    assert make_buckets([50, 2], 10, first_elems=1) == [[1], [0]]  # a tensor is never split
    with pytest.raises(ValueError, match="first_elems"):
        make_buckets([1], 1, first_elems=0)
