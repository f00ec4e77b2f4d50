"""Run one rank's part of a collective over a transport: ring, any pure schedule, sparse gather.

The schedules are `ring.py`'s and `algorithms.py`'s; these functions only walk them, moving
pieces with a transport (`testbed.runtime.transport`) and adding or copying what arrives. No Ray import:
the transport is whatever the actor wired. Buffers are numpy arrays or torch tensors (any
device: adds run where the buffer lives). Every function returns bytes as they went on the
wire (after the `Wire` encoding), before any logical/physical scaling.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from testbed.allreduce.algorithms import Round
from testbed.allreduce.ring import allgather_schedule, chunk_bounds, scatter_reduce_schedule
from testbed.runtime.transport import Wire, like

_PLAIN = Wire(half=False)


def ring_allreduce(buf: Any, rank: int, n: int, transport: Any, tag: Any, wire: Wire = _PLAIN) -> int:
    """Sum `buf` across the ring in place (scatter-reduce, then allgather); return bytes sent."""
    if n == 1:
        return 0
    if (getattr(transport, "computes", False) and isinstance(buf, np.ndarray) and not wire.half
            and len(buf) * buf.itemsize >= n * COMPUTED_BYTES):
        return _ring_computed(buf, rank, n, transport, tag)
    bounds = chunk_bounds(len(buf), n)
    itemsize = wire.itemsize(buf)
    sent = 0
    for phase, schedule in (("rs", scatter_reduce_schedule(rank, n)), ("ag", allgather_schedule(rank, n))):
        for i, (s, r) in enumerate(schedule):
            (s0, s1), (r0, r1) = bounds[s], bounds[r]
            got = transport.exchange((tag, phase, i), wire.encode(buf[s0:s1]), r1 - r0)
            incoming = like(wire.decode(got), buf)
            sent += (s1 - s0) * itemsize
            if phase == "rs":
                buf[r0:r1] += incoming
            else:
                buf[r0:r1] = incoming
            del got, incoming  # may pin a channel buffer the left peer's next send needs
    wire.round(buf)  # the owner's chunk too, so every replica holds the same values
    return sent


BLOCK = 1 << 16  # elements (256 KiB of float32): a forwarded chunk is read once, from the cache
COMPUTED_BYTES = 64 * 1024  # chunks from this size on are computed in the link; below, the extra
# Python of a computed send costs more than the passes over memory it saves


def _ring_computed(buf: np.ndarray, rank: int, n: int, transport: Any, tag: Any) -> int:
    """`ring_allreduce` over a link that computes each message in its room (`exchange_computed`,
    channels.py "computed sends"): the same messages, fewer passes over memory.

    Scatter-reduce step i >= 1 sends the chunk received at step i-1 plus our own; that partial
    sum is needed nowhere else (allgather overwrites the chunk), so it is added straight into
    the message: 3 chunk-sized passes (read both, write the message) instead of 5 (add into the
    buffer: 3; copy it into the ring: 2). Allgather step i >= 1 forwards the chunk received at
    step i-1: copied into the buffer and into the message block by block, it is read once (3
    passes, not 4). Step 0 of each phase sends from the buffer, the last one of each stores
    what came. Same additions in the same order as `ring_allreduce`: bit-identical results.
    For N = 4 that is 21 passes a round where the plain ring makes 27.
    """
    bounds = chunk_bounds(len(buf), n)
    dtype, sent = buf.dtype, 0
    held: Any = None  # the chunk received at the previous step, to be sent on (a view of the link)
    for phase, schedule in (("rs", scatter_reduce_schedule(rank, n)), ("ag", allgather_schedule(rank, n))):
        last = len(schedule) - 1
        for i, (s, r) in enumerate(schedule):
            (s0, s1), (r0, r1) = bounds[s], bounds[r]
            mine = buf[s0:s1]
            if held is None:
                got = transport.exchange((tag, phase, i), mine, r1 - r0)
            else:
                came = held
                if phase == "rs":
                    def fill(out: np.ndarray, came: np.ndarray = came, mine: np.ndarray = mine) -> None:
                        np.add(mine, came, out=out)
                else:
                    def fill(out: np.ndarray, came: np.ndarray = came, mine: np.ndarray = mine) -> None:
                        for b in range(0, len(came), BLOCK):
                            piece = came[b:b + BLOCK]
                            mine[b:b + BLOCK] = piece
                            out[b:b + BLOCK] = piece
                held = came = None
                got = transport.exchange_computed((tag, phase, i), dtype, s1 - s0, fill, r1 - r0)
                del fill
            sent += (s1 - s0) * buf.itemsize
            if i < last:
                held = got  # sent on, computed, at the next step
            elif phase == "rs":
                buf[r0:r1] += got  # our own chunk, fully reduced
            else:
                buf[r0:r1] = got
            del got
    return sent


def run_schedule(buf: Any, rounds: Sequence[Round], transport: Any, tag: Any,
                 wire: Wire = _PLAIN) -> tuple[int, int]:
    """Walk one rank's rounds in place: sends first, then receives; return (sent, received)."""
    itemsize = wire.itemsize(buf)
    sent = recv = 0
    for t, rnd in enumerate(rounds):
        for tr in rnd.sends:
            transport.send_to(tr.peer, (tag, t), wire.encode(buf[tr.lo:tr.hi]))
            sent += (tr.hi - tr.lo) * itemsize
        for tr in rnd.recvs:
            template = wire.encode(buf[0:0])
            got = transport.recv_from(tr.peer, (tag, t), tr.hi - tr.lo, template)
            incoming = like(wire.decode(got), buf)
            recv += (tr.hi - tr.lo) * itemsize
            if tr.add:
                buf[tr.lo:tr.hi] += incoming
            else:
                buf[tr.lo:tr.hi] = incoming
        transport.flush()
    if rounds:  # nothing travels with one worker, so nothing is rounded either
        wire.round(buf)
    return sent, recv


def sparse_ring_allgather(packed: np.ndarray, rank: int, n: int, transport: Any, tag: Any) -> list[np.ndarray]:
    """Pass every rank's equal-sized packed top-k payload around the ring; return all, by rank.

    N-1 steps: at step i rank r forwards what it got at step i-1 (its own at step 0) to r+1 and
    receives rank (r-i-1)'s payload from r-1. Each rank sends (N-1) payloads.
    """
    pieces: list[Any] = [None] * n
    pieces[rank] = current = packed
    for i in range(n - 1):
        # a copy: the received view pins the channel buffer, and every piece is kept
        current = np.array(like(transport.exchange((tag, "sg", i), current, len(packed)), packed))
        pieces[(rank - i - 1) % n] = current
    return pieces
