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

One node: a ring buffer, many messages deep (`shm.Sender` and `shm.Receiver`):

    writer: send(tag, departure, chunk)                          reader: recv(tag)
      1. room in the ring? else take acks                          1. take wake bytes (all there are)
         (all there are; wait only if none)                        2. read the next message
      2. write the message after the last one --[ shared memory ]-->  3. ack at once (small) or
      3. write a wake byte                    --[ FIFO "wake" ]---->     at the next send/recv (large)
                                              <--[ FIFO "ack" ]-----

- Depth: the ring holds at least three of the largest messages and often many more, so a peer
  sends on without waiting for its right neighbour to read; with more peers than cores that
  saves a sleep and a wake-up per hop (`shm.py`). Across nodes a Ray channel holds one message.
- Messages: a chunk up to SMALL_BYTES is copied out by the reader, so its room is free the
  moment it is read. A larger one is read zero-copy, and that view pins its room. Contract:
  drop every view of a received chunk before the next `send` or `recv` on the link
  (`collectives.py` deletes them each step) -- the ack says so to the writer, and it is sent
  before this peer waits for anything, so no cycle of waits can form around the ring. On a
  channel (across nodes) a small chunk travels as one bytes object (header + raw data), which
  Ray writes without its serializer, a large one as a (tag, departure, array) tuple.
- Waiting happens in the kernel: one FIFO byte per message ("wake", writer -> reader) and one
  per release ("ack", reader -> writer), counted one for one, so a taken wake byte always has
  its message in the ring. Ray's own blocking channel read and write spin on a core (with 8
  peers on 2 cores the spinners would steal the CPU the working peers need), so a channel
  (across nodes, no FIFOs) is only ever tried with timeout=0 and polled: yield the core
  (sched_yield) for SPIN_S, then sleep with exponential backoff capped at MAX_SLEEP_S. Every
  wait checks the abort flag (recovery: `StepAborted`) and the deadline (a dead or hung peer:
  `RemoteTimeout`) at least every CHECK_S.
- The message carries its tag; a receiver that gets another tag than its schedule expects
  raises at once instead of adding the wrong chunk.
- A message larger than the ring allows (`shm.ROOM` of it) moves the link to a new segment; a
  channel is re-created by Ray, which tells the reader through the old one (that rare write
  waits in Ray's own blocking call).
- Computed sends (`Link.send_computed`): the ring's scatter-reduce writes its partial sum, and
  its allgather the chunk it forwards, straight into the room of the next message
  (`Sender.reserve`, then `commit`), instead of into the buffer and then copied into the ring
  (`collectives.py` counts the passes). The peer reserves while it still holds the chunk it
  read, so it may wait for room holding a pinned view. That cannot close a cycle. A ring has
  room for a largest message while at most one large message of ours is unreleased
  (`shm.Sender`); a small one is released as it is read. A peer sending step s whose right
  neighbour is sending step s' (holding our step s' - 1, pinned if it is large) has at most
  s - s' + 1 of ours unreleased, one of them large, so it waits only if s > s'; a peer
  waiting to receive step s has sent its step s, so its left neighbour, not having sent step
  s yet, is not ahead of it either. The differences s - s' add up to 0 around the ring, so not
  every peer can be waiting. A message that would move the link (which needs the ring empty)
  is computed elsewhere and sent.
- Recovery rebuilds every link (`wiring.wire_ring`), so nothing of an aborted attempt is read.
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

from testbed.allreduce.shm import CHECK_S, ROOM, SMALL_BYTES, Receiver, Sender, checked
from testbed.runtime.remote import RemoteTimeout

SPIN_S = 5e-5
MAX_SLEEP_S = 2.5e-4
MIN_BYTES = 64 * 1024  # Ray's minimum is 1000 bytes; small buckets never trigger a resize
HEADROOM = 4096  # tag, departure stamp and pickle framing around the chunk


class Outgoing:
    """The writer's end of a link: with the reader on this node a `shm.Sender` (a ring of ROOM
    of the largest messages), else a Ray channel.

    Create it on the writer actor (Ray lets only a channel's writer create it) and hand
    `reader_end()` to the reader.
    """

    def __init__(self, reader: Any, reader_node: str, nbytes: int) -> None:
        capacity = max(MIN_BYTES, int(nbytes) + HEADROOM)
        self.channel: Any = None
        self.sender: Sender | None = None
        if reader_node == ray.get_runtime_context().get_node_id():
            self.sender = Sender(ROOM * capacity)
        else:
            from ray.experimental.channel.shared_memory_channel import Channel

            me = ray.get_runtime_context().current_actor
            self.channel = Channel(me, [(reader, reader_node)], capacity)

    def reader_end(self) -> tuple[Any, Any]:
        """("shm", (segment path, capacity, wake path, ack path)) on one node; else (the Ray
        channel, None)."""
        if self.sender is not None:
            return "shm", self.sender.reader_end()
        return self.channel, None

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
            self.sender = None


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
        self.receiver = Receiver(*left[1]) if named and left[0] == "shm" else None
        self.inp = None if named else left[0]  # a Ray channel from the left
        self._serialize = ray._private.worker.global_worker.get_serialization_context().serialize

    def close(self) -> None:
        """Close the reader's end (the writer's belongs to its `Outgoing`) and stop using both:
        a waiter still in this link sees it closed at its next check."""
        self._closed = True
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None

    def _released(self) -> None:
        """The caller has dropped every view of the last message read (the contract): its
        room is free, so tell the left writer -- before we wait for anything ourselves, or
        every peer could wait for its right neighbour's ack around the ring."""
        if self.receiver is not None:
            self.receiver.release()

    def send(self, tag: Any, departure: float | None, chunk: np.ndarray) -> None:
        receiver = self.receiver
        if receiver is not None and receiver.pinned:  # _released, inline: this runs every hop
            receiver.release()
        sender = None if self.out_slot else self._outgoing.sender  # None once the Outgoing is closed
        if sender is not None:  # one node
            sender.send(tag, departure, chunk, self.timeout, self.aborted)
            return
        if self.out_slot is not None:
            self.out_slot.put(tag, departure, chunk, self.timeout, self.aborted)
            return
        value = self._serialize(encode(tag, departure, chunk))  # once, not once per try
        size = value.total_bytes + len(value.metadata)
        capacity = getattr(getattr(self.out, "_typ", None), "buffer_size_bytes", 0)
        if size > capacity:  # growth: Ray resizes and signals the reader in one blocking call
            from ray.exceptions import RayChannelTimeoutError

            try:
                self.out.write(value, timeout=self.timeout)
            except RayChannelTimeoutError:
                raise RemoteTimeout(f"send of {tag} did not complete within {self.timeout:g}s; "
                                    "the neighbouring peer may be dead or hung") from None
        else:
            poll(lambda: self.out.write(value, timeout=0), self.timeout, self.aborted, f"send of {tag}")

    @property
    def computes(self) -> bool:
        """Whether `send_computed` writes into the ring: both neighbours share this node (a shm
        ring each way; a Ray channel's received view must be dropped before the next send)."""
        return self.receiver is not None and self.out_slot is None and self._outgoing.sender is not None

    def send_computed(self, tag: Any, departure: float | None, dtype: np.dtype, numel: int,
                      fill: Callable[[np.ndarray], Any]) -> None:
        """Send a message that `fill(out)` computes into `out` (numel elements of dtype): on one
        node `out` is the message's room in the ring, so the result is written once, where the
        reader reads it; elsewhere a new array, then sent. `fill` may read the last chunk
        received, which stays pinned until it is done ("computed sends" in the docstring)."""
        sender = None if self.out_slot else self._outgoing.sender
        out = sender.reserve(tag, departure, dtype, numel, self.timeout, self.aborted) if sender else None
        if out is None:  # another kind of link, or a message that moves this one
            out = np.empty(numel, dtype)
            fill(out)
            self.send(tag, departure, out)
            return
        try:
            fill(out)
        except BaseException:
            sender.cancel()
            raise
        del out  # no view of the ring outlives the message
        sender.commit()

    def recv(self, tag: Any) -> tuple[float | None, np.ndarray]:
        """(departure, chunk) of the next message, which must carry `tag`."""
        receiver = self.receiver
        if receiver is not None:  # one node
            if receiver.pinned:
                receiver.release()
            got, departure, chunk = receiver.recv(self.timeout, self.aborted, tag)
        else:
            self._released()
            if self.in_slot is not None:
                got, departure, chunk = self.in_slot.take(self.timeout, self.aborted, f"message {tag}")
            else:
                message = poll(lambda: self.inp.read(timeout=0), self.timeout, self.aborted, f"message {tag}")
                got, departure, chunk = decode(message)
        if got != tag:
            raise RuntimeError(f"ring link out of step: expected message {tag}, got {got}")
        return departure, chunk
