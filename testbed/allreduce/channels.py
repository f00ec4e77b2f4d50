"""Neighbour links of the object-store ring: shared memory between two processes, the ring's
data path.

Why not one actor call per chunk: a Ray actor call costs about 1-2 ms of CPU on the 2-core
reference machine (task submission, gRPC, a hand-off between the receiver's threads), so a
4 KB ring step with 8 peers cost ~5-8 ms. A link is created once per neighbour pair instead,
and every message is written into the same buffer and read in place:

- both ends on one node: a `Segment` (`shm.py`), a file in /dev/shm that both processes map. A message is
  a header and a memcpy; no Ray call, no serializer (Ray's shared-memory `Channel` does the
  same job with its object layer, `get_objects` and deserialisation, on every read).
- across nodes: a Ray `Channel` (one *mutable* object in the object store; Ray pushes the
  buffer to the reader's node).

`python -m testbed.bench allreduce` measures this path (ring-objstore) beside one actor call per
chunk (ring-calls) and gloo.

One link = one writer -> one reader, depth one:

    writer: send(tag, departure, chunk)                          reader: recv(tag)
      1. take an ack (the previous message is released)            1. take a wake byte
      2. write into the buffer            --[ shared memory ]-->   2. read the message
      3. write a wake byte                --[ FIFO "wake" ]---->   3. ack at once (small) or
                                          <--[ FIFO "ack" ]-----      at the next send/recv (large)

- Messages: a chunk up to SMALL_BYTES is copied out by the reader, so the buffer is free the
  moment it is read. A larger one is read zero-copy, and that view pins the buffer. Contract:
  drop every view of a received chunk before the next `send` or `recv` on the link
  (`collectives.py` deletes them each step) -- the ack says so to the writer, and it is sent
  before this peer waits for anything, so no cycle of waits can form around the ring. On a
  channel (across nodes) a small chunk travels as one bytes object (header + raw data), which
  Ray writes without its serializer, a large one as a (tag, departure, array) tuple.
- Waiting happens in the kernel: one FIFO byte per message ("wake", writer -> reader) and one
  per release ("ack", reader -> writer), taken one for one, so the buffer operation after a
  taken byte always finds its change. Ray's own blocking channel read and write spin on a core
  (with 8 peers on 2 cores the spinners would steal the CPU the working peers need), so a
  channel (across nodes, no FIFOs) is only ever tried with timeout=0 and polled: yield the core
  (sched_yield) for SPIN_S, then sleep with exponential backoff capped at MAX_SLEEP_S. Every
  wait checks the abort flag (recovery: `StepAborted`) and the deadline (a dead or hung peer:
  `RemoteTimeout`) at least every CHECK_S.
- The message carries its tag; a receiver that gets another tag than its schedule expects
  raises at once instead of adding the wrong chunk.
- A message larger than the buffer: a segment moves to a new one twice its size (the old one
  carries the new one's name for that message); a channel is re-created by Ray, which tells the
  reader through the old one (that rare write waits in Ray's own blocking call).
- Recovery rebuilds every link (`peer.wire_ring`), so nothing of an aborted attempt is read.
- Names in /dev/shm and the FIFOs' in the temporary folder live only until the reader attaches
  (or the writer closes a link nobody attached).

`Channel` is Ray's alpha-stability API (ray.experimental.channel); only this module touches it.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import ray

from testbed.allreduce.shm import CHECK_S, SMALL_BYTES, Segment, Signal, checked, notify, take
from testbed.runtime.remote import RemoteTimeout

SPIN_S = 5e-5
MAX_SLEEP_S = 2.5e-4
MIN_BYTES = 64 * 1024  # Ray's minimum is 1000 bytes; small buckets never trigger a resize
HEADROOM = 4096  # tag, departure stamp and pickle framing around the chunk


class Outgoing:
    """The writer's end of a link: the channel and, with the reader on this node, two signals:
    `wake` (a message is there) and `ack` (the reader released the previous one).

    Create it on the writer actor (Ray lets only a channel's writer create it) and hand
    `reader_end()` to the reader.
    """

    def __init__(self, reader: Any, reader_node: str, nbytes: int) -> None:
        capacity = max(MIN_BYTES, int(nbytes) + HEADROOM)
        self.channel: Any = None
        self.segment: Segment | None = None
        self.signals: tuple[Signal, Signal] | None = None
        if reader_node == ray.get_runtime_context().get_node_id():
            self.segment = Segment(capacity)
            self.signals = (Signal(), Signal())
        else:
            from ray.experimental.channel.shared_memory_channel import Channel

            me = ray.get_runtime_context().current_actor
            self.channel = Channel(me, [(reader, reader_node)], capacity)

    def reader_end(self) -> tuple[Any, Any]:
        """("shm", (segment path, capacity, wake path, ack path)) on one node; else (the Ray
        channel, None)."""
        if self.segment is not None:
            return "shm", (self.segment.path, self.segment.capacity, self.signals[0].path, self.signals[1].path)
        return self.channel, None

    def close(self) -> None:
        for signal in self.signals or ():
            signal.close()
        self.signals = None
        if self.segment is not None:
            self.segment.close()
            self.segment = None


def encode(tag: Any, departure: float | None, chunk: np.ndarray) -> Any:
    """A message. Small chunks: one bytes object (4-byte header length, pickled header, raw
    data), which Ray writes without its serializer and the reader gets as a private copy that
    pins nothing. Large chunks: a tuple, whose array the reader gets zero-copy."""
    if chunk.nbytes > SMALL_BYTES:
        return (tag, departure, chunk)
    head = pickle.dumps((tag, departure, chunk.dtype.str, chunk.shape), protocol=pickle.HIGHEST_PROTOCOL)
    return b"".join((len(head).to_bytes(4, "little"), head, np.ascontiguousarray(chunk).tobytes()))


def decode(message: Any) -> tuple[Any, float | None, np.ndarray]:
    if not isinstance(message, bytes):
        return message
    n = int.from_bytes(message[:4], "little")
    tag, departure, dtype, shape = pickle.loads(message[4:4 + n])
    return tag, departure, np.frombuffer(message, dtype=dtype, offset=4 + n).reshape(shape)


def poll(attempt: Callable[[], Any], timeout: float, aborted: Callable[[], bool], what: str) -> Any:
    """Call attempt() (one timeout=0 channel operation) until it succeeds. Between tries:
    yield the core for SPIN_S, then sleep with capped exponential backoff."""
    from ray.exceptions import RayChannelTimeoutError

    t0 = time.monotonic()
    delay = 1e-5
    while True:
        try:
            return attempt()
        except RayChannelTimeoutError:
            pass
        waited = checked(t0, timeout, aborted, what)
        if waited < SPIN_S:
            os.sched_yield()
        else:
            time.sleep(delay)
            delay = min(2 * delay, MAX_SLEEP_S)


class Slot:
    """A link between two peers of one process (testbed.runtime.hosting): one message at a
    time, handed from the writer's thread to the reader's under a condition variable.

    The writer puts a private copy (the sender's buffer changes in the next round), waits
    while the previous message is still there (depth one, as a channel), and the reader takes
    it. No process switch, no shared-memory object: a hop costs a copy and a thread hand-off.
    Waits look at the abort flag and the deadline at least every CHECK_S.
    """

    def __init__(self) -> None:
        self.key = f"slot-{uuid.uuid4().hex}"
        self._cv = threading.Condition()
        self._message: tuple[Any, float | None, np.ndarray] | None = None
        SLOTS[self.key] = self

    def _wait(self, ready: Callable[[], bool], timeout: float, aborted: Callable[[], bool], what: str) -> None:
        t0 = time.monotonic()
        while not ready():
            checked(t0, timeout, aborted, what)
            self._cv.wait(CHECK_S)

    def put(self, tag: Any, departure: float | None, chunk: np.ndarray, timeout: float,
            aborted: Callable[[], bool]) -> None:
        copy = np.array(chunk, copy=True)
        with self._cv:
            self._wait(lambda: self._message is None, timeout, aborted, f"send of {tag}")
            self._message = (tag, departure, copy)
            self._cv.notify_all()

    def take(self, timeout: float, aborted: Callable[[], bool], what: str) -> tuple[Any, float | None, np.ndarray]:
        with self._cv:
            self._wait(lambda: self._message is not None, timeout, aborted, what)
            message, self._message = self._message, None
            self._cv.notify_all()
        return message

    def reader_end(self) -> tuple[str, str]:
        return ("slot", self.key)

    def close(self) -> None:
        SLOTS.pop(self.key, None)


SLOTS: dict[str, Slot] = {}  # this process's slots by key: how the reader finds its writer's


class Link:
    """A peer's two ring links: `out` to the right neighbour (we write), and from the left
    one, whose `Outgoing.reader_end()` is `left`. Either may be a `Slot` instead, where the
    neighbour lives in this process (its reader end is ("slot", key))."""

    def __init__(self, out: Outgoing | Slot, left: tuple[Any, Any], timeout: float,
                 aborted: Callable[[], bool]) -> None:
        self.timeout = timeout
        self._closed = False
        self.aborted = lambda: self._closed or aborted()  # a closed link stops its waiters too
        self.out_slot = out if isinstance(out, Slot) else None
        named = isinstance(left[0], str)  # ("slot", key) or ("shm", ...); else a Ray channel
        self.in_slot = SLOTS.pop(left[1]) if named and left[0] == "slot" else None
        self._outgoing = None if self.out_slot else out
        self.out = None if self.out_slot else out.channel
        self.in_seg: Segment | None = None
        if named and left[0] == "shm":
            path, capacity, wake, ack = left[1]
            self.in_seg = Segment.attach(path, capacity)
            self.inp, paths = None, (wake, ack)
        else:
            self.inp, paths = (None, None) if self.in_slot else left
        self._serialize = ray._private.worker.global_worker.get_serialization_context().serialize
        # our writes: wake the right peer, take its acks; our reads: the mirror image
        signals = None if self.out_slot else out.signals
        self.wake_right = signals[0].fd if signals else None
        self.acks = signals[1].fd if signals else None
        self.wakes = Signal.attach(paths[0]) if paths else None
        self.ack_left = Signal.attach(paths[1]) if paths else None
        self._sent = 0
        self._pinned = False  # the last message read is a zero-copy view of the buffer

    def close(self) -> None:
        """Close the reader-side signals (the writer side belongs to its `Outgoing`) and stop
        using all four: a waiter still in this link sees it closed at its next check."""
        self._closed = True
        for fd in (self.wakes, self.ack_left):
            if fd is not None:
                os.close(fd)
        self.wakes = self.ack_left = self.wake_right = self.acks = None
        if self.in_seg is not None:
            self.in_seg.close()
            self.in_seg = None

    def _released(self) -> None:
        """The caller has dropped every view of the last message read (the contract): its
        buffer is free, so tell the left writer -- before we wait for anything ourselves, or
        every peer could wait for its right neighbour's ack around the ring."""
        if self._pinned:
            notify(self.ack_left)
            self._pinned = False

    def send(self, tag: Any, departure: float | None, chunk: np.ndarray) -> None:
        self._released()
        if self.out_slot is not None:
            self.out_slot.put(tag, departure, chunk, self.timeout, self.aborted)
            return
        segment = self._outgoing.segment
        if segment is not None:  # one node: the signals order every access to the buffer
            if self._sent:  # the reader has released the previous one
                take(self.acks, self.timeout, self.aborted, f"send of {tag}")
            if not segment.write(tag, departure, chunk):
                self._grow(segment, tag, departure, chunk)
            self._sent += 1
            notify(self.wake_right)
            return
        value = self._serialize(encode(tag, departure, chunk))  # once, not once per try
        size = value.total_bytes + len(value.metadata)
        capacity = getattr(getattr(self.out, "_typ", None), "buffer_size_bytes", 0)
        left = self.timeout  # one timeout for the whole wait
        if self.acks is not None and self._sent:  # the reader has released the previous one
            left = take(self.acks, self.timeout, self.aborted, f"send of {tag}")
        if size > capacity:  # growth: Ray resizes and signals the reader in one blocking call
            from ray.exceptions import RayChannelTimeoutError

            try:
                self.out.write(value, timeout=left)
            except RayChannelTimeoutError:
                raise RemoteTimeout(f"send of {tag} did not complete within {self.timeout:g}s; "
                                    "the neighbouring peer may be dead or hung") from None
        else:
            poll(lambda: self.out.write(value, timeout=0), left, self.aborted, f"send of {tag}")
        self._sent += 1
        notify(self.wake_right)

    def _grow(self, old: Segment, tag: Any, departure: float | None, chunk: np.ndarray) -> None:
        """The message into a new segment twice the size it needs; the old one points there."""
        new = Segment(max(2 * old.capacity, 2 * (np.asarray(chunk).nbytes + HEADROOM)))
        if not new.write(tag, departure, chunk):  # pragma: no cover - sized for it above
            raise RuntimeError(f"ring link: a {chunk.nbytes}-byte message does not fit a new segment")
        old.write(tag, departure, chunk, moved=(new.path, new.capacity))
        self._outgoing.segment = new
        old.close()  # ours only: the reader keeps its mapping until it follows the pointer

    def recv(self, tag: Any) -> tuple[float | None, np.ndarray]:
        """(departure, chunk) of the next message, which must carry `tag`."""
        self._released()
        if self.in_slot is not None:
            got, departure, chunk = self.in_slot.take(self.timeout, self.aborted, f"message {tag}")
            if got != tag:
                raise RuntimeError(f"ring link out of step: expected message {tag}, got {got}")
            return departure, chunk
        if self.in_seg is not None:
            take(self.wakes, self.timeout, self.aborted, f"message {tag}")
            got, departure, chunk, pinned, moved = self.in_seg.read()
            if moved is not None:  # the writer outgrew the segment: the message is in the next
                old, self.in_seg = self.in_seg, Segment.attach(*moved)
                old.close()
                got, departure, chunk, pinned, _ = self.in_seg.read()
            self._pinned = pinned
            if not pinned:  # a copy: the buffer is free already
                notify(self.ack_left)
            if got != tag:
                raise RuntimeError(f"ring link out of step: expected message {tag}, got {got}")
            return departure, chunk
        left = self.timeout  # one timeout for the whole wait
        if self.wakes is not None:
            left = take(self.wakes, self.timeout, self.aborted, f"message {tag}")
        message = poll(lambda: self.inp.read(timeout=0), left, self.aborted, f"message {tag}")
        self._pinned = not isinstance(message, bytes)
        if not self._pinned:  # a bytes message is a copy: the buffer is free already
            notify(self.ack_left)
        got, departure, chunk = decode(message)
        if got != tag:
            raise RuntimeError(f"ring link out of step: expected message {tag}, got {got}")
        return departure, chunk
