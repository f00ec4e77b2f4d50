"""The channel link's pure parts -- the wait loops (poll, take), the message formats and the
shared-memory segment -- no Ray cluster."""

import os
import time

import numpy as np
import pytest
from ray.exceptions import RayChannelTimeoutError

from testbed.allreduce import channels, shm
from testbed.allreduce.channels import decode, encode, poll
from testbed.allreduce.shm import SMALL_BYTES
from testbed.runtime.remote import RemoteTimeout
from testbed.runtime.transport import StepAborted


class _Flaky:
    """An operation that times out `misses` times, then returns `value`."""

    def __init__(self, misses: int, value: object = "ok") -> None:
        self.misses, self.value, self.calls = misses, value, 0

    def __call__(self) -> object:
        self.calls += 1
        if self.calls <= self.misses:
            raise RayChannelTimeoutError("not yet")
        return self.value


@pytest.mark.parametrize("misses", [0, 1, 50])
def test_poll_retries_until_the_operation_succeeds(misses):
    op = _Flaky(misses, value=("tag", 1.0, b"x"))
    assert poll(op, timeout=10, aborted=lambda: False, what="m") == ("tag", 1.0, b"x")
    assert op.calls == misses + 1


def test_poll_raises_step_aborted_when_the_driver_aborts():
    flags = iter([False, False, True])
    op = _Flaky(10**9)
    with pytest.raises(StepAborted, match="message 7"):
        poll(op, timeout=10, aborted=lambda: next(flags), what="message 7")
    assert op.calls == 3


def test_poll_gives_up_at_the_deadline_with_the_cause():
    with pytest.raises(RemoteTimeout, match=r"send of \('t', 1\) did not complete within 0.05s"):
        poll(_Flaky(10**9), timeout=0.05, aborted=lambda: False, what="send of ('t', 1)")


def test_poll_sleeps_with_capped_backoff_after_the_spin(monkeypatch):
    sleeps = []
    monkeypatch.setattr(channels, "SPIN_S", 0.0)
    monkeypatch.setattr(channels.time, "sleep", sleeps.append)
    poll(_Flaky(12), timeout=10, aborted=lambda: False, what="m")
    assert len(sleeps) == 12
    assert all(b >= a for a, b in zip(sleeps, sleeps[1:], strict=False))  # never shrinks
    assert max(sleeps) == channels.MAX_SLEEP_S  # reaches the cap and stays there


def test_other_errors_are_not_swallowed():
    def broken():
        raise ValueError("channel closed")

    with pytest.raises(ValueError, match="channel closed"):
        poll(broken, timeout=10, aborted=lambda: False, what="m")


def test_wait_bytes_takes_every_byte_there_is_and_gives_up_with_the_cause():
    r, w = os.pipe()
    try:
        os.set_blocking(r, False)
        os.write(w, b"!!!")
        assert shm.wait_bytes(r, time.monotonic(), 5, lambda: False, "m") == b"!!!"
        with pytest.raises(RemoteTimeout, match="message 3 did not complete"):
            shm.wait_bytes(r, time.monotonic(), 0.05, lambda: False, "message 3")
        with pytest.raises(StepAborted):
            shm.wait_bytes(r, time.monotonic(), 5, lambda: True, "m")
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("shape, dtype", [((0,), np.float32), ((7,), np.float32), ((3, 5), np.float16),
                                          ((SMALL_BYTES // 4 + 1,), np.float32)])
def test_encode_decode_round_trip(shape, dtype):
    chunk = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    message = encode(("b", 3, "rs", 1), 12.5, chunk)
    assert isinstance(message, bytes) == (chunk.nbytes <= SMALL_BYTES)  # small: raw bytes
    tag, departure, got = decode(message)
    assert tag == ("b", 3, "rs", 1) and departure == 12.5
    assert got.dtype == chunk.dtype and got.shape == chunk.shape
    np.testing.assert_array_equal(got, chunk)


def test_a_slot_hands_copies_over_in_order_one_at_a_time_between_threads():
    """Two peers of one process (testbed.runtime.hosting): the writer waits while its previous
    message is unread, the reader gets each message once, in order, as a private copy."""
    import threading

    slot = channels.Slot()
    buf = np.zeros(4, dtype=np.float32)
    got = []

    def reader():
        for _ in range(50):
            got.append(slot.take(10, lambda: False, "m"))

    t = threading.Thread(target=reader)
    t.start()
    for i in range(50):
        buf[:] = i  # the sender's buffer changes at once: the message must not
        slot.put(("b", i), float(i), buf, 10, lambda: False)
    t.join(10)
    assert [g[0] for g in got] == [("b", i) for i in range(50)]
    assert all((g[2] == i).all() and g[1] == float(i) for i, g in enumerate(got))
    slot.close()
    assert slot.key not in channels.SLOTS


def test_a_slot_wait_ends_on_abort_and_on_its_deadline():
    slot = channels.Slot()
    with pytest.raises(RemoteTimeout, match="message 3"):
        slot.take(0.2, lambda: False, "message 3")
    slot.put("x", None, np.ones(1), 1, lambda: False)
    with pytest.raises(StepAborted, match="send of y"):  # full: the next put waits, then sees the abort
        slot.put("y", None, np.ones(1), 10, lambda: True)
    slot.close()


def _ends(capacity: int) -> tuple[shm.Sender, shm.Receiver]:
    sender = shm.Sender(capacity)
    receiver = shm.Receiver(*sender.reader_end())
    return sender, receiver


def _message(rng: np.random.Generator, i: int, usual: int, big: int) -> np.ndarray:
    """Message i of a seeded stream: mostly up to `usual` elements, now and then up to `big`."""
    n = int(rng.integers(0, big if rng.random() < 0.1 else usual))
    return np.full(n, i, np.float32) + np.arange(n, dtype=np.float32)


@pytest.mark.parametrize("capacity, usual, big", [
    (4096, 40, 400),
    (4096, 40, 2000),  # 2000 floats outgrow the 4 KiB ring: the link moves
    (4 << 20, 300_000, 480_000),  # mostly above SMALL_BYTES: read in place, the ring drained before each
])
def test_a_ring_delivers_every_message_in_order_whatever_wraps_fills_or_moves(capacity, usual, big):
    """One writer, one reader, a small ring, in a seeded interleaving: the reader reads at
    random moments and whenever the writer finds no room (a send that may not wait raises).
    The ring wraps, fills, starts again at 0 when empty and, with big messages, moves to a
    larger segment; the reader must see exactly the stream sent (the list, the reference)."""
    sender, receiver = _ends(capacity)
    rng = np.random.default_rng(big)
    sent, got = [], []
    count = 600 if capacity < SMALL_BYTES else 60

    def read_one() -> None:
        tag, departure, chunk = receiver.recv(1, lambda: False, "m")
        got.append((tag, departure, np.array(chunk)))
        del chunk
        receiver.release()

    for i in range(count):
        chunk = _message(rng, i, usual, big)
        sent.append((("m", i), float(i), chunk.copy()))
        while True:
            try:
                sender.send(("m", i), float(i), chunk, 0, lambda: False)
                break
            except RemoteTimeout:  # full: the writer would wait for the reader
                read_one()
        chunk += 1000  # the sender's buffer changes at once: the message must not
        while len(got) < len(sent) and rng.random() < 0.4:
            read_one()
    while len(got) < len(sent):
        read_one()
    for (tag, dep, chunk), (etag, edep, expect) in zip(got, sent, strict=True):
        assert (tag, dep) == (etag, edep)
        np.testing.assert_array_equal(chunk, expect)
    moves = shm.ROOM * shm.footprint(100, 4 * big) > capacity
    assert (sender.segment.capacity > capacity) == moves
    receiver.close()
    sender.close()


@pytest.mark.parametrize("seed", range(2))
def test_a_ring_whose_one_message_left_is_pinned_has_room_for_a_largest_one(seed):
    """What the ring's computed sends rely on not to deadlock (shm.Sender): whatever the
    sequence of messages, wraps and restarts at 0 before, a ring whose one unreleased message
    is a large one (read in place, so pinned until released) has room for one more of the
    largest size it takes (capacity / ROOM). A small one is released as it is read."""
    rng = np.random.default_rng(seed)
    largest = SMALL_BYTES // 4 + 2000
    capacity = shm.ROOM * shm.footprint(64, 4 * largest)
    sender, receiver = _ends(capacity)
    sizes: list[int] = []  # bytes of every message sent, in order
    checked = 0
    for i in range(3000):
        n = int(rng.integers(largest // 2, largest + 1)) if rng.random() < 0.8 else int(rng.integers(0, 64))
        try:
            sender.send(i, None, np.zeros(n, np.float32), 0, lambda: False)
            sizes.append(4 * n)
        except RemoteTimeout:  # full: the reader reads below
            pass
        while rng.random() < 0.6:
            try:
                receiver.recv(0, lambda: False, "m")
            except RemoteTimeout:
                break
            receiver.release()
        sender._released(0.0, 0, lambda: False, "", wait=False)
        if len(sender.starts) == 1 and sizes[-1] > SMALL_BYTES:
            checked += 1
            assert sender._fit(shm.footprint(64, 4 * largest)) is not None, (i, sender.head, list(sender.starts))
    assert checked > 10
    receiver.close()
    sender.close()


def test_a_ring_holds_many_small_messages_before_any_is_read():
    sender, receiver = _ends(channels.MIN_BYTES)
    for i in range(50):  # no reader yet: none of these may wait
        sender.send(i, None, np.full(128, i, np.float32), 0.01, lambda: False)
    for i in range(50):
        tag, _, chunk = receiver.recv(1, lambda: False, "m")
        assert tag == i and (chunk == i).all()
    receiver.close()
    sender.close()


@pytest.mark.parametrize("shape, dtype", [((0,), np.float32), ((), np.float64), ((3, 5), np.float16),
                                          ((2, 0, 3), np.int64), ((7,), np.uint8),
                                          ((SMALL_BYTES // 4 + 1,), np.float32), ((600, 300), np.int32)])
def test_a_ring_message_keeps_its_dtype_shape_and_bytes(shape, dtype):
    """What arrives is the array sent: same dtype, shape and bytes, small (a private, writable
    copy) or large (a view of the ring) alike."""
    sender, receiver = _ends(channels.MIN_BYTES)
    chunk = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    sender.send("t", 1.5, chunk, 1, lambda: False)
    tag, departure, got = receiver.recv(1, lambda: False, "t")
    assert (tag, departure, got.dtype, got.shape) == ("t", 1.5, chunk.dtype, chunk.shape)
    np.testing.assert_array_equal(got, chunk)
    if chunk.nbytes <= SMALL_BYTES:
        assert got.flags.writeable and not receiver.pinned
    del got
    receiver.release()
    receiver.close()
    sender.close()


def test_a_large_message_is_read_in_place_and_its_room_waits_for_the_release():
    """A chunk above SMALL_BYTES is a view of the ring, pinned until `release`: the writer
    may not write over it before then, and the view outlives the ring's unmapping."""
    big = np.random.default_rng(1).standard_normal(SMALL_BYTES // 4 + 1).astype(np.float32)
    sender, receiver = _ends(shm.ROOM * shm.footprint(100, big.nbytes))  # room for ROOM of them
    for i in range(shm.ROOM):
        sender.send("a" if i == 0 else ("b", i), None, big, 1, lambda: False)
    tag, _, got = receiver.recv(1, lambda: False, "m")
    assert tag == "a" and np.shares_memory(got, np.frombuffer(receiver.segment.buf, np.uint8))
    with pytest.raises(RemoteTimeout, match="send of c"):  # "a" is still pinned: no room
        sender.send("c", None, big, 0.1, lambda: False)
    with pytest.raises(StepAborted, match="send of c"):
        sender.send("c", None, big, 10, lambda: True)
    receiver.release()
    sender.send("c", None, big, 1, lambda: False)
    np.testing.assert_array_equal(got, big)
    receiver.close()  # pinned by `got`: unmapped when it goes, not now
    assert got.sum() == pytest.approx(big.sum())
    del got
    sender.close()


def test_a_segment_nobody_attached_is_removed_by_its_writer():
    sender = shm.Sender(channels.MIN_BYTES)
    path = sender.reader_end()[0]
    assert os.path.exists(path)
    sender.close()
    assert not os.path.exists(path)


class _Out:
    """An `Outgoing` on one node without Ray: a `shm.Sender` and its reader end."""

    def __init__(self, capacity: int) -> None:
        self.sender, self.channel = shm.Sender(capacity), None

    def reader_end(self) -> tuple[str, tuple[str, int, str, str]]:
        return "shm", self.sender.reader_end()


@pytest.mark.parametrize("n, length", [(2, 70_000), (3, 200_001), (4, 1 << 18), (5, 16_384 * 5 + 3), (4, 1000)])
def test_a_ring_over_shm_links_sums_bit_for_bit_as_the_reference(n, length):
    """N peers (threads) on shared-memory links of a ring just big enough (`ROOM` of a chunk):
    every copy equals ring.py's one-process ring bit for bit, whether chunks are computed in the
    link (64 KiB and up) or copied, so the computed sends neither change a sum nor deadlock."""
    from concurrent.futures import ThreadPoolExecutor

    from testbed.allreduce.collectives import COMPUTED_BYTES, ring_allreduce
    from testbed.allreduce.ring import reference_allreduce
    from testbed.config import NetworkConfig
    from testbed.emulation.endpoint import Endpoint
    from testbed.runtime.transport import ObjectStoreTransport, Wire

    rng = np.random.default_rng([n, length])
    originals = [rng.standard_normal(length).astype(np.float32) for _ in range(n)]
    expected = reference_allreduce(originals)
    chunk = 4 * (-(-length // n))
    outs = [_Out(shm.ROOM * (chunk + channels.HEADROOM)) for _ in range(n)]
    links = [channels.Link(outs[r], outs[(r - 1) % n].reader_end(), 10, lambda: False) for r in range(n)]
    computed = [0] * n

    def peer(r: int) -> None:
        transport = ObjectStoreTransport(None, None, 10, Endpoint(NetworkConfig(), f"p{r}"), 1.0, link=links[r])
        plain = transport.exchange_computed

        def counted(*args, **kwargs):
            computed[r] += 1
            return plain(*args, **kwargs)

        transport.exchange_computed = counted
        for k in range(3):  # rounds back to back: the rings wrap and start again
            buf = originals[r].copy()
            ring_allreduce(buf, r, n, transport, ("t", k), Wire())  # a stuck peer raises after 10 s
            np.testing.assert_array_equal(buf, expected[r])

    with ThreadPoolExecutor(n) as pool:
        for done in [pool.submit(peer, r) for r in range(n)]:
            done.result()
    computes = n > 2 and length * 4 >= n * COMPUTED_BYTES  # steps 1..N-2 of each phase, 3 rounds
    assert computed == [2 * (n - 2) * 3 if computes else 0] * n
    for link, out in zip(links, outs, strict=True):
        link.close()
        out.sender.close()
