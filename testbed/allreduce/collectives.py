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
