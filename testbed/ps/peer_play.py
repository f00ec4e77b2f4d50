"""A parameter server's messages beside ps-async's emulated peers, played in order of emulated
time by one thread (testbed.ps.server's ShardActor holds one where the driver plays peers,
testbed.ps.async_peers). No Ray.

    event  (time, tie, kind)        at its time
      0    a peer's copy left  -->  queue it on the ingress; at its delivery, event 1
      1    a copy delivered    -->  apply it (the server's `apply_copy`): a notice for the driver
      2    a real push left    -->  queue it on the ingress (its lateness is its arrival's); event 3
      3    a push delivered    -->  apply it (the server's `apply_real`); its call goes on

One thread orders every message through the server's NIC, real or not, so that the real workers
land at random among the copies that left with them, as the cost model draws the order of those
that leave together (testbed.ps.flow), not in an order of this machine's: a push queued on
arrival comes a Ray call after every copy that left with it, and a reply queued by the push's
own thread goes ahead of the copies' replies while this thread is behind. Either skews the mean
iteration: a worker always last, or always first, at every server ends its iterations unlike the
model's workers. A message is queued a settle window after it left (`settle`), so that a real
push that left at the same instant has reached the process; ties are drawn at random.

Acting after an event's time is lateness (`late_s`), counted from the event's time or from the
last act, whichever is later (as `Endpoint.delivery` counts a message's).
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from testbed.emulation.endpoint import Endpoint
from testbed.ps.async_peers import Entry, Notice

# the most a message waits after its departure before it is queued on the ingress: far more than
# a Ray call takes to reach the server here (about 1 ms)
SETTLE_S = 0.02

COPY_LEFT, COPY_DELIVERED, PUSH_LEFT, PUSH_DELIVERED = range(4)


class PeerPlay:
    def __init__(self, endpoint: Endpoint, rank: int, apply_copy: Callable[[Entry, float], Notice],
                 apply_real: Callable[[dict[str, Any], float], None]) -> None:
        self.endpoint, self.rank = endpoint, rank
        self.apply_copy, self.apply_real = apply_copy, apply_real
        self.timeout = 60.0  # how long a copy may wait for its owner's first gradient (`copies` sets it)
        self.latest: dict[tuple[int, int], tuple[np.ndarray, float, int]] = {}  # (worker, part) -> newest
        self.latest_cv = threading.Condition()
        self.queue: list[tuple[float, float, int, Any]] = []  # (time, tie, kind, (bytes, entry or slot))
        self.cv = threading.Condition()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.ties = random.Random(rank)  # who lands first among messages that leave together
        self.outbox: list[Notice] = []
        self.outbox_cv = threading.Condition()
        self.late_s = 0.0
        self._clock = 0.0  # when the thread last acted

    def keep(self, part: int, worker: int, grad: np.ndarray, loss: float, samples: int) -> None:
        """A real worker's gradient of `part`, on receipt: its peers' copies apply the newest."""
        with self.latest_cv:
            self.latest[(worker, part)] = (grad, loss, samples)
            self.latest_cv.notify_all()

    def newest(self, worker: int, part: int) -> tuple[np.ndarray, float, int]:
        """`worker`'s newest gradient of `part`, with its loss and samples; its first push may
        still be on its way (a Ray call, not the model)."""
        with self.latest_cv:
            if not self.latest_cv.wait_for(lambda: (worker, part) in self.latest, self.timeout):
                raise TimeoutError(f"worker {worker}'s gradient of partition {part} never came")
            return self.latest[(worker, part)]

    def settle(self, nbytes: int) -> float:
        """How long after its departure a message of `nbytes` is queued on the ingress: long
        enough for a real push that left at the same instant to have reached this process, no
        longer than the latency and the message's transfer (its earliest delivery), at most
        SETTLE_S."""
        if self.endpoint.nic is None:
            return 0.0
        link = self.endpoint.nic.link
        return min(SETTLE_S, link.latency + link.transfer_s(nbytes))

    def _add(self, departure: float, kind: int, nbytes: int, what: Any) -> None:
        """Under `cv`: an event at the message's departure plus its settle, and the thread."""
        heapq.heappush(self.queue, (departure + self.settle(nbytes), self.ties.random(), kind, (nbytes, what)))
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="peers", daemon=True)
            self.thread.start()
        self.cv.notify_all()

    def copies(self, entries: list[tuple[int, Entry]], timeout: float) -> None:
        """(bytes, entry) of peers' copies to play; `timeout`: see `newest`."""
        self.timeout = timeout
        with self.cv:
            for nbytes, e in entries:
                self._add(e[4], COPY_LEFT, nbytes, e)

    def real(self, nbytes: int, departure: float, arrived: float, push: tuple[Any, ...]) -> dict[str, Any]:
        """Play a real push that reached the process at `arrived`; wait until it was applied.
        Returns its slot: what `apply_real` put there ("ack", "delivered", "applied", "reply")."""
        slot: dict[str, Any] = {"event": threading.Event(), "arrived": arrived, "departure": departure,
                                "push": push}
        with self.cv:
            self._add(departure, PUSH_LEFT, nbytes, slot)
        if not slot["event"].wait(self.timeout):
            raise TimeoutError(f"parameter server {self.rank}: a push of partition {push[0]} was never applied")
        if "error" in slot:
            raise RuntimeError(f"parameter server {self.rank}: its peer thread failed: {slot['error']}")
        return slot

    def notices(self, timeout: float, gather: float) -> list[Notice]:
        """What the thread did with copies since the last call: waits up to `timeout` for the
        first notice, then `gather` seconds more, so that one call carries those that follow it."""
        with self.outbox_cv:
            self.outbox_cv.wait_for(lambda: self.outbox or self.error is not None, timeout)
        if self.outbox and gather > 0:
            time.sleep(gather)
        with self.outbox_cv:
            if self.error is not None:
                raise RuntimeError(f"parameter server {self.rank}: its emulated peers failed: "
                                   f"{type(self.error).__name__}: {self.error}")
            out, self.outbox = self.outbox, []
        return out

    def _loop(self) -> None:
        what: Any = None
        try:
            while True:
                with self.cv:
                    while not self.queue or self.queue[0][0] > time.time():
                        self.cv.wait(None if not self.queue else self.queue[0][0] - time.time())
                    t, tie, kind, (nbytes, what) = heapq.heappop(self.queue)
                now = time.time()
                if now > max(t, self._clock):
                    self.late_s += now - max(t, self._clock)
                self._clock = now
                if kind in (COPY_LEFT, PUSH_LEFT):
                    if kind == COPY_LEFT:
                        due = self.endpoint.delivery(nbytes, what[4], timed=False)
                    else:
                        due = self.endpoint.delivery(nbytes, what["departure"], what["arrived"])
                    with self.cv:
                        heapq.heappush(self.queue, (due, tie, kind + 1, (nbytes, what)))
                elif kind == PUSH_DELIVERED:
                    self.apply_real(what, t)
                    what["event"].set()
                else:
                    note = self.apply_copy(what, t)
                    with self.outbox_cv:
                        self.outbox.append(note)
                        self.outbox_cv.notify_all()
        except BaseException as exc:  # noqa: BLE001 -- handed to the driver by `notices`
            with self.outbox_cv:
                self.error = exc
                self.outbox_cv.notify_all()
            with self.cv:  # real pushes waiting for the thread, the one it held too: they fail, not hang
                slots = [w for *_, (_, w) in self.queue if isinstance(w, dict)] + ([what] if isinstance(what, dict) else [])
                for slot in slots:
                    slot["error"] = f"{type(exc).__name__}: {exc}"
                    slot["event"].set()
