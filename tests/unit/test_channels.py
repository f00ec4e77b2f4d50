"""The channel link's wait loop (channels.poll): retries, abort, deadline -- no Ray cluster."""

import pytest
from ray.exceptions import RayChannelTimeoutError

from testbed.allreduce import channels
from testbed.allreduce.channels import poll
from testbed.allreduce.transport import StepAborted
from testbed.remote import RemoteTimeout


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
