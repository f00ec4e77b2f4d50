"""The same-node half of a ring link (`channels.py`): a shared-memory buffer both processes map,
and FIFOs that carry one byte per message ("wake") and per release ("ack"), so that a waiting
peer sleeps in the kernel instead of spinning on a core. No Ray here: the link in `channels.py`
puts these together, and its docstring draws the protocol.
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
    creates it, the reader `attach`es it and removes the name, as with a `Signal`.

    One message at a time (the link's depth one; the signals order every access):

        offset 0    u32 header length h, u32 data length d
        offset 8    the header: pickled (tag, departure, dtype, shape, moved-to)
        offset 8+h  d bytes of the chunk

    A message that does not fit goes into a new, larger segment; the old one carries only a
    header whose moved-to names it, so the reader maps the new one, reads the message there
    and drops the old: one wake per message still.
    """

    FRAME = struct.Struct("<II")

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

    def write(self, tag: Any, departure: float | None, chunk: np.ndarray, moved: tuple[str, int] | None = None) -> bool:
        """Put one message (or, with `moved`, only the pointer to the next segment); False when
        the chunk does not fit."""
        data = np.ascontiguousarray(chunk)
        head = pickle.dumps((tag, departure, data.dtype.str, data.shape, moved), protocol=pickle.HIGHEST_PROTOCOL)
        d = 0 if moved else data.nbytes
        if self.FRAME.size + len(head) + d > self.capacity:
            return False
        self.FRAME.pack_into(self.buf, 0, len(head), d)
        at = self.FRAME.size + len(head)
        self.buf[self.FRAME.size:at] = head
        if d:
            np.frombuffer(self.buf, np.uint8, d, at)[:] = data.reshape(-1).view(np.uint8)
        return True

    def read(self) -> tuple[Any, float | None, np.ndarray, bool, tuple[str, int] | None]:
        """(tag, departure, chunk, pinned, moved-to) of the message there: a chunk up to
        SMALL_BYTES is copied out; a larger one is a view of the buffer (pinned: it holds the
        buffer until dropped)."""
        h, d = self.FRAME.unpack_from(self.buf, 0)
        at = self.FRAME.size + h
        tag, departure, dtype, shape, moved = pickle.loads(self.buf[self.FRAME.size:at])
        if moved:
            return tag, departure, np.empty(0), False, moved
        view = np.frombuffer(self.buf, np.uint8, d, at)
        pinned = d > SMALL_BYTES
        chunk = (view if pinned else view.copy()).view(dtype).reshape(shape)
        return tag, departure, chunk, pinned, None

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


def notify(fd: int | None) -> None:
    """Write one signal byte. At depth one a FIFO holds at most a byte or two, so a full
    pipe means the counts are broken: fail loudly rather than lose a wake-up."""
    if fd is not None:
        os.write(fd, b"!")


def checked(t0: float, timeout: float, aborted: Callable[[], bool], what: str) -> float:
    """Raise if the step was aborted or the wait that began at t0 ran out; else seconds waited."""
    if aborted():
        raise StepAborted(f"{what}: the step was aborted (a peer died)")
    waited = time.monotonic() - t0
    if waited > timeout:
        raise RemoteTimeout(f"{what} did not complete within {timeout:g}s; "
                            "the neighbouring peer may be dead or hung")
    return waited


def take(fd: int, timeout: float, aborted: Callable[[], bool], what: str) -> float:
    """Block until one signal byte arrives on fd and consume it (one byte per message or
    release, so the channel operation after it succeeds at its first try); return the
    seconds left of `timeout`, for that operation."""
    try:  # the byte is often there already (a busy machine): no poll, no clock
        os.read(fd, 1)
        return timeout
    except BlockingIOError:
        pass
    t0 = time.monotonic()
    waiter = select.poll()  # not select.select: that one fails for fds >= 1024
    waiter.register(fd, select.POLLIN)
    while True:
        checked(t0, timeout, aborted, what)
        if waiter.poll(CHECK_S * 1000):
            try:
                os.read(fd, 1)
                return max(0.0, timeout - (time.monotonic() - t0))
            except BlockingIOError:  # pragma: no cover - another reader of the same fd
                pass
