"""The channel link's pure parts -- the wait loops (poll, take), the message formats and the
shared-memory segment -- no Ray cluster."""

import os

import numpy as np
import pytest
from ray.exceptions import RayChannelTimeoutError

from testbed.allreduce import channels, shm
from testbed.allreduce.channels import decode, encode, poll
from testbed.allreduce.shm import SMALL_BYTES, take
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


def test_take_consumes_exactly_one_signal_byte():
    r, w = os.pipe()
    try:
        os.set_blocking(r, False)
        os.write(w, b"!!")
        take(r, timeout=5, aborted=lambda: False, what="m")
        take(r, timeout=5, aborted=lambda: False, what="m")  # the second byte is still there
        with pytest.raises(RemoteTimeout, match="message 3 did not complete"):
            take(r, timeout=0.05, aborted=lambda: False, what="message 3")
        with pytest.raises(StepAborted):
            take(r, timeout=5, aborted=lambda: True, what="m")
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


def test_a_segment_carries_one_message_at_a_time_copied_when_small_and_pinned_when_large():
    writer = shm.Segment(channels.MIN_BYTES)
    reader = shm.Segment.attach(writer.path, writer.capacity)
    assert not os.path.exists(writer.path)  # attached: the name is gone
    small = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert writer.write(("b", 1), 2.5, small)
    tag, departure, got, pinned, moved = reader.read()
    assert (tag, departure, pinned, moved) == (("b", 1), 2.5, False, None)
    np.testing.assert_array_equal(got, small)
    assert writer.write("c", None, np.zeros(3, np.float32)) and (got == small).all()  # a private copy
    big = np.random.default_rng(1).standard_normal(SMALL_BYTES // 4 + 1).astype(np.float32)
    assert not writer.write("d", None, big)  # does not fit 64 KiB: the caller grows the link
    large = shm.Segment(4 * big.nbytes)
    assert large.write("d", None, big)
    assert writer.write("d", None, big[:1], moved=(large.path, large.capacity))
    tag, _, _, _, moved = reader.read()
    assert tag == "d" and moved == (large.path, large.capacity)
    follow = shm.Segment.attach(*moved)
    tag, _, got, pinned, _ = follow.read()
    assert tag == "d" and pinned and np.shares_memory(got, np.frombuffer(follow.buf, np.uint8))
    np.testing.assert_array_equal(got, big)
    follow.close()  # pinned by `got`: unmapped when it goes, not now
    assert got.sum() == pytest.approx(big.sum())
    del got
    for seg in (reader, writer, large):
        seg.close()


def test_a_segment_nobody_attached_is_removed_by_its_writer():
    seg = shm.Segment(channels.MIN_BYTES)
    assert os.path.exists(seg.path)
    seg.close()
    assert not os.path.exists(seg.path)
