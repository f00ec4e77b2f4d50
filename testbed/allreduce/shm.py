"""The same-node half of a ring link (`channels.py`): a shared-memory ring buffer both processes
map, and FIFOs that carry one byte per message ("wake") and per release ("ack"), so that a
waiting peer sleeps in the kernel instead of spinning on a core. No Ray here: `Sender` and
`Receiver` are the link's two ends, and `channels.py`'s docstring draws the protocol.

Why a ring buffer and not one message at a time: with more peers than cores, a depth-one link
makes every peer stop after each hop until its right neighbour has read the message, so every
hop of every peer costs a sleep and a wake-up: a context switch and a cold cache, far more
than the hop's own work. With room for many messages a peer runs on through every hop whose
input is already there (`python -m testbed.bench allreduce` measures the CPU of a ring).
"""


from __future__ import annotations

import mmap
import os
import pickle
import select
import struct
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from testbed.runtime.remote import RemoteTimeout
from testbed.runtime.transport import StepAborted

CHECK_S = 0.05  # a wait blocked on a signal looks at the abort flag and deadline this often
SMALL_BYTES = 256 * 1024  # chunks up to this are copied out on reading (and travel as bytes on a channel)


class Signal:
    """A one-way counted signal between two processes of one node: a FIFO of one-byte tokens.

    The creating side opens it read-write (so neither side ever blocks or fails opening it),
    `attach` opens the other side and removes the name. Bytes are counted one for one with
    messages (or releases), so the channel operation after a taken byte finds its change.
    """

    def __init__(self) -> None:
        self.path = os.path.join(tempfile.gettempdir(), f"testbed-link-{uuid.uuid4().hex}")
        os.mkfifo(self.path, 0o600)
        self.fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)

    @staticmethod
    def attach(path: str) -> int:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        os.unlink(path)  # both sides are open: the name is no longer needed
        return fd

    def close(self) -> None:
        """Close our side; remove the name if the other side never attached."""
        os.close(self.fd)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class Segment:
    """A shared-memory buffer for one link whose two ends share a node: a file in /dev/shm
    (tmpfs; the temporary folder where there is none), mapped by both processes. The writer
    creates it, the reader `attach`es it and removes the name, as with a `Signal`. The message
    layout is `Sender`'s."""

    def __init__(self, capacity: int) -> None:
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        self.path = os.path.join(folder, f"testbed-link-{uuid.uuid4().hex}")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, capacity)
            self.buf = mmap.mmap(fd, capacity)
        finally:
            os.close(fd)
        self.capacity = capacity

    @classmethod
    def attach(cls, path: str, capacity: int) -> Segment:
        seg = cls.__new__(cls)
        fd = os.open(path, os.O_RDWR)
        try:
            seg.buf = mmap.mmap(fd, capacity)
        finally:
            os.close(fd)
        os.unlink(path)  # both sides have it mapped: the name is no longer needed
        seg.path, seg.capacity = path, capacity
        return seg

    def close(self) -> None:
        """Unmap (unless a received view still pins it: then when that view goes) and remove
        the name if the reader never attached."""
        try:
            self.buf.close()
        except BufferError:  # a zero-copy chunk still points into it; it unmaps with the last view
            pass
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


ALIGN = 64  # every message starts on a cache line, and so does its data
FRAME = struct.Struct("<II")  # header length (or WRAP), data length
WRAP = 0xFFFFFFFF  # "the next message is at offset 0"
ROOM = 3  # the largest messages a ring holds: see `Sender` (why three)
MAX_DEPTH = 1024  # messages out at once: their wake and ack bytes stay far below a pipe's capacity


_UP = ALIGN - 1  # ALIGN is a power of two: (n + _UP) & ~_UP rounds n up to a multiple of it


def _aligned(n: int) -> int:
    return (n + _UP) & ~_UP


def footprint(header: int, data: int) -> int:
    """Bytes a message takes in the ring: frame and pickled header, then the data on its own
    cache line, rounded up to the next one."""
    return _aligned(FRAME.size + header) + _aligned(data)


class Sender:
    """The writer's end: a `Segment` used as a ring buffer of messages, and the two signals.

    Layout (every offset a multiple of ALIGN):

        [ msg k-2 | msg k-1 | msg k ...free... ]      a message at offset o:
          ^ oldest unreleased     ^ head                o        u32 header length h, u32 data length d
                                                        o+8      pickled (tag, departure, dtype, shape, moved-to)
                                                        align(o+8+h)  d bytes of data

    A message goes at `head` when it fits before the end, else a WRAP frame goes there and the
    message at offset 0; so does one that finds the ring empty, whose pages are warmer there. It
    never overwrites a message the reader has not released (one ack byte per message, in order,
    so `starts` -- where each unreleased message's bytes begin, its WRAP frame included -- pops
    one per byte). The writer reads acks only when the ring is full (or holds MAX_DEPTH
    messages), all that came at once, and waits only if none came.

    Capacity is at least ROOM (three) times the largest message. So a message always fits once
    the ring is empty, and also while one large message (read in place, so pinned until
    released) is still there: the free space around it, two messages' worth, is in at most two
    pieces, so one holds a message. A large message that restarts the empty ring at 0 keeps
    the WRAP frame behind it until it is released, so it restarts only where the piece before
    that frame holds a largest message. That is what lets a peer wait for room holding the
    message it read (`reserve`; the argument is channels.py's "computed sends").

    A message larger than capacity / ROOM moves the link: the writer waits until the reader has
    released everything, puts a frame whose moved-to names a new segment twice that size, and
    writes the message at its start (one wake still; the reader follows and unmaps the old one).
    """

    def __init__(self, capacity: int) -> None:
        self.segment = Segment(_aligned(capacity))
        self.wake, self.ack = Signal(), Signal()
        self.head = 0
        self._before = 0  # head before the last reserve (cancel)
        self.starts: deque[int] = deque()

    def reader_end(self) -> tuple[str, int, str, str]:
        return self.segment.path, self.segment.capacity, self.wake.path, self.ack.path

    def send(self, tag: Any, departure: float | None, chunk: np.ndarray, timeout: float,
             aborted: Callable[[], bool]) -> None:
        """Put one message in the ring and wake the reader; wait while there is no room."""
        data = np.ascontiguousarray(chunk)  # (1-D data of a 0-d chunk: the header keeps its shape)
        at, head = self._claim(tag, departure, data.dtype, chunk.shape, data.nbytes, timeout, aborted, True)
        self._put(at, head, data)
        os.write(self.wake.fd, b"!")

    def _claim(self, tag: Any, departure: float | None, dtype: np.dtype, shape: tuple[int, ...], nbytes: int,
               timeout: float, aborted: Callable[[], bool], may_move: bool) -> tuple[tuple[int, int], bytes] | None:
        """Room for a message: (where it goes, its pickled header), waiting while there is none;
        a message larger than the ring allows moves the link first, or, unless `may_move`, None."""
        head = pickle.dumps((tag, departure, dtype.str, shape, None), protocol=pickle.HIGHEST_PROTOCOL)
        size = footprint(len(head), nbytes)
        if ROOM * size > self.segment.capacity:
            if not may_move:
                return None
            self._move(ROOM * size, tag, timeout, aborted)
        if nbytes > SMALL_BYTES:  # worth a syscall: if the ring is empty, start it again
            self._released(0.0, timeout, aborted, "", wait=False)
        at = self._fit(size)
        if at is None:
            t0 = time.monotonic()
            while (at := self._fit(size)) is None:
                self._released(t0, timeout, aborted, f"send of {tag}")
        return at, head

    def _fit(self, size: int) -> tuple[int, int] | None:
        """(offset of the message, where its bytes begin), or None while the ring is too full."""
        if len(self.starts) >= MAX_DEPTH:
            return None
        cap, head = self.segment.capacity, self.head
        if not self.starts and 0 < size <= head and (size <= SMALL_BYTES or size + cap // ROOM <= head):
            return 0, head  # empty: back to the start (a WRAP frame at head; see the docstring)
        tail = self.starts[0] if self.starts else None
        if tail is None or head > tail:  # free: [head, cap) and [0, tail)
            if head + size <= cap:
                return head, head
            if size <= (head if tail is None else tail):
                return 0, head  # a WRAP frame at head
            return None
        return (head, head) if head < tail and head + size <= tail else None

    def reserve(self, tag: Any, departure: float | None, dtype: np.dtype, numel: int, timeout: float,
                aborted: Callable[[], bool]) -> np.ndarray | None:
        """Room for the next message in the ring, as a writable 1-D array of `numel` elements of
        `dtype`: the caller computes the message there, then `commit`s it (or `cancel`s); the
        reader sees nothing before. Waits while there is no room, as `send` does. None where
        the message would move the link (that needs the ring empty: compute elsewhere, `send`).

        A caller may wait here holding a view of a received message: the ring's reserves chain
        back to earlier steps, never around to themselves (channels.py, "computed sends")."""
        nbytes = numel * dtype.itemsize
        claimed = self._claim(tag, departure, dtype, (numel,), nbytes, timeout, aborted, False)
        if claimed is None:
            return None
        self._before = self.head
        return np.frombuffer(self.segment.buf, dtype, numel, self._frame(*claimed, nbytes))

    def commit(self) -> None:
        """The reserved message is written: wake the reader."""
        os.write(self.wake.fd, b"!")

    def cancel(self) -> None:
        """Give the reserved room back (its computation failed): the next message goes there."""
        self.starts.pop()
        self.head = self._before

    def _put(self, at: tuple[int, int], head: bytes, data: np.ndarray) -> None:
        d0 = self._frame(at, head, data.nbytes)
        self.segment.buf[d0:d0 + data.nbytes] = data  # the array's bytes (C-contiguous): one memcpy

    def _frame(self, at: tuple[int, int], head: bytes, nbytes: int) -> int:
        """Write a message's frame and header at `at` (and a WRAP frame where it wraps), take
        its room; return where its data goes."""
        o, begins = at
        buf = self.segment.buf
        if o != begins:
            FRAME.pack_into(buf, begins, WRAP, 0)
        FRAME.pack_into(buf, o, len(head), nbytes)
        h0 = o + FRAME.size
        buf[h0:h0 + len(head)] = head
        d0 = (h0 + len(head) + _UP) & ~_UP
        self.starts.append(begins)
        end = d0 + ((nbytes + _UP) & ~_UP)
        self.head = 0 if end >= self.segment.capacity else end
        return d0

    def _released(self, t0: float, timeout: float, aborted: Callable[[], bool], what: str,
                  wait: bool = True) -> None:
        """Take every ack byte there is, waiting for one if there is none (and `wait`)."""
        try:
            got = os.read(self.ack.fd, 4096)
        except BlockingIOError:
            if not wait:
                return
            got = wait_bytes(self.ack.fd, t0, timeout, aborted, what)
        if len(got) > len(self.starts):
            raise RuntimeError(f"ring link: {len(got)} releases for {len(self.starts)} messages out")
        for _ in got:
            self.starts.popleft()

    def _move(self, capacity: int, tag: Any, timeout: float, aborted: Callable[[], bool]) -> None:
        """Wait for the ring to empty, then point the reader to a new segment of `capacity`."""
        t0 = time.monotonic()
        while self.starts:
            self._released(t0, timeout, aborted, f"send of {tag}")
        new = Segment(_aligned(max(capacity, 2 * self.segment.capacity)))
        try:
            pointer = pickle.dumps((tag, None, "", (), (new.path, new.capacity)), protocol=pickle.HIGHEST_PROTOCOL)
            self._put(self._fit(footprint(len(pointer), 0)), pointer, np.empty(0, np.uint8))
        except BaseException:
            new.close()  # nobody will attach it: its name would outlive the run in /dev/shm
            raise
        old, self.segment = self.segment, new
        self.head, self.starts = 0, deque()
        old.close()  # ours only: the reader keeps its mapping until it follows the pointer

    def close(self) -> None:
        for signal in (self.wake, self.ack):
            signal.close()
        self.segment.close()


class Receiver:
    """The reader's end: reads the ring in the sender's order. A chunk up to SMALL_BYTES is
    copied out, and its ack goes at once; a larger one is a view of the ring (pinned), acked by
    `release` when the caller has dropped it. Wake bytes that came together are taken with one
    read and counted."""

    def __init__(self, path: str, capacity: int, wake: str, ack: str) -> None:
        self.segment = Segment.attach(path, capacity)
        self.wake, self.ack = Signal.attach(wake), Signal.attach(ack)
        self.pos = 0
        self.ready = 0  # wake bytes taken, messages not yet read
        self.pinned = False

    def release(self) -> None:
        """The caller has dropped every view of the last message read: ack it."""
        if self.pinned:
            os.write(self.ack, b"!")
            self.pinned = False

    def recv(self, timeout: float, aborted: Callable[[], bool], expected: Any) -> tuple[Any, float | None, np.ndarray]:
        """(tag, departure, chunk) of the next message, waiting for it (`expected`: the tag
        the caller expects, named if the wait fails)."""
        if not self.ready:
            try:
                got = os.read(self.wake, 4096)
            except BlockingIOError:
                got = wait_bytes(self.wake, time.monotonic(), timeout, aborted, f"message {expected}")
            self.ready = len(got)
        self.ready -= 1
        buf = self.segment.buf
        o = self.pos
        h, d = FRAME.unpack_from(buf, o)
        if h == WRAP:
            o = 0
            h, d = FRAME.unpack_from(buf, o)
        h0 = o + FRAME.size
        tag, departure, dtype, shape, moved = pickle.loads(buf[h0:h0 + h])
        if moved is not None:  # the sender outgrew the ring: the message starts the next one
            old, self.segment = self.segment, Segment.attach(*moved)
            old.close()
            self.pos, self.ready = 0, self.ready + 1
            return self.recv(timeout, aborted, expected)
        d0 = (h0 + h + _UP) & ~_UP
        end = d0 + ((d + _UP) & ~_UP)
        self.pos = 0 if end >= self.segment.capacity else end
        dt = _dtype(dtype)
        chunk = np.frombuffer(buf, dt, d // dt.itemsize if dt.itemsize else 0, d0)
        self.pinned = d > SMALL_BYTES
        if not self.pinned:
            chunk = chunk.copy()
            os.write(self.ack, b"!")
        return tag, departure, chunk if len(shape) == 1 else chunk.reshape(shape)

    def close(self) -> None:
        for fd in (self.wake, self.ack):
            os.close(fd)
        self.segment.close()


_DTYPES: dict[str, np.dtype] = {}


def _dtype(name: str) -> np.dtype:
    """np.dtype(name), made once per name."""
    dt = _DTYPES.get(name)
    if dt is None:
        dt = _DTYPES[name] = np.dtype(name)
    return dt


def checked(t0: float, timeout: float, aborted: Callable[[], bool], what: str) -> float:
    """Raise if the step was aborted or the wait that began at t0 ran out; else seconds waited."""
    if aborted():
        raise StepAborted(f"{what}: the step was aborted (a peer died)")
    waited = time.monotonic() - t0
    if waited > timeout:
        raise RemoteTimeout(f"{what} did not complete within {timeout:g}s; "
                            "the neighbouring peer may be dead or hung")
    return waited


def wait_bytes(fd: int, t0: float, timeout: float, aborted: Callable[[], bool], what: str) -> bytes:
    """Block until signal bytes arrive on fd (a wait that began at t0) and take all of them:
    at least one."""
    waiter = select.poll()  # not select.select: that one fails for fds >= 1024
    waiter.register(fd, select.POLLIN)
    while True:
        checked(t0, timeout, aborted, what)
        if waiter.poll(CHECK_S * 1000):
            try:
                return os.read(fd, 4096)
            except BlockingIOError:  # pragma: no cover - another reader of the same fd
                pass
