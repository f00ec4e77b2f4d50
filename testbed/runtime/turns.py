"""One worker's steps in turn, so that the driver can queue its next step while this one runs.

A real data-parallel job has no driver between two steps; a testbed run does (it collects N
reports and issues N calls). So the ring's and gossip's drivers issue step t+1 together with
step t, the actor's spare thread takes the call, and it waits here until step t has ended in
this worker; the driver's round trip then never sits between two steps. An abort (the ring's
recovery) wakes a waiting step, which then fails; `redo` makes a step that is run again next.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from testbed.runtime.remote import RemoteTimeout
from testbed.runtime.transport import StepAborted


class Turns:
    def __init__(self) -> None:
        self._cv = threading.Condition()
        self.done = -1  # the last step that ended here

    def wait(self, iteration: int, timeout: float, aborted: Callable[[], bool], who: str) -> None:
        """Block until step `iteration - 1` has ended here; raise if aborted or past `timeout`."""
        with self._cv:
            ready = self._cv.wait_for(lambda: self.done >= iteration - 1 or aborted(), timeout=timeout)
        if aborted():
            raise StepAborted(f"{who} step {iteration}: aborted before it began (a peer died)")
        if not ready:
            raise RemoteTimeout(f"{who}: step {iteration - 1} did not end within {timeout:g}s, so step "
                                f"{iteration} could not begin")

    def ended(self, iteration: int) -> None:
        with self._cv:
            self.done = iteration
            self._cv.notify_all()

    def redo(self, iteration: int) -> None:
        """Step `iteration` runs next (again)."""
        with self._cv:
            self.done = iteration - 1
            self._cv.notify_all()

    def wake(self) -> None:
        """Let a waiting step look at its abort flag."""
        with self._cv:
            self._cv.notify_all()
