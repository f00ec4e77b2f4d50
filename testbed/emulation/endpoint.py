"""One endpoint's view of the (optionally emulated) network: send stamps, receive waits.

In real mode (`--bandwidth` unset) both calls are free no-ops and only logical bytes are
counted. In emulated mode the endpoint owns a `network.Nic`: `send` queues the message on the
egress and returns the departure stamp that travels with the message; `receive` queues it on
the receiver's ingress and sleeps until delivery. Wall-clock stamps (time.time) are shared by all
processes of one machine; across machines they assume synchronised clocks.

Fidelity: a message that reaches the receiver after its emulated delivery time carried real
cost (a Ray call, a busy core) the emulator could not hide inside the emulated transfer. Every
endpoint adds up that lateness (`late_s`, `late_messages`); runs report it beside the cost model,
so a measurement that drifts from the model says why.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from testbed.config import NetworkConfig
from testbed.emulation.network import LinkSpec, Nic, sleep_until


class Endpoint:
    def __init__(self, net: NetworkConfig, name: str, shared: str | None = None) -> None:
        """`shared`: a file made by `Nic.create_shared` when processes of one machine share its NIC."""
        # --dilation D: the emulated cluster runs D times slower (testbed.emulation.dilation)
        link = None if net.wire is None else LinkSpec(*net.wire)
        self.nic = Nic(link, name, shared) if link is not None else None
        self.bytes_out = 0
        self.bytes_in = 0
        self.late_s = 0.0  # seconds messages arrived after their emulated delivery
        self.late_messages = 0
        self.messages_in = 0
        self._taken = 0.0
        self._last_arrival = 0.0  # the latest arrival of a timed message so far

    @property
    def emulated(self) -> bool:
        return self.nic is not None

    def send(self, nbytes: int, at: float | None = None) -> float | None:
        """Queue nbytes on the egress; return the departure stamp that travels with the message.
        `at`: when the message is ready to leave in the emulated cluster (default: now; the ring
        with emulated peers sends at the model's times, testbed.allreduce.relay).

        The sender need not sleep: its egress reservation alone delays its later messages, and
        the receiver waits until delivery. So real transport latency (a Ray call takes about a
        millisecond here) hides inside the emulated a + n/B instead of adding to it. A sender with
        many messages in flight to the same receivers (the parameter server's partitions) hands
        each to the transport at its departure (`sleep_until`), so that receivers, which queue in
        the order messages reach them, see them in departure order.
        """
        self.bytes_out += nbytes
        if self.nic is None:
            return None
        return self.nic.reserve_egress(nbytes, time.time() if at is None else at)[0]

    def delivery(self, nbytes: int, departure: float | None, arrived: float | None = None,
                 timed: bool = True) -> float:
        """Reserve the ingress for a message that arrived at `arrived` (default: now); return when
        it is delivered (its arrival in real mode). Arriving after that time counts as lateness,
        unless not `timed`: a message of a schedule computed at the model's times, which only
        has to end on time (`finish`; the ring with emulated peers, testbed.allreduce.relay).

        Only the lateness this message adds is counted: it is measured from its due time or from
        the previous message's arrival, whichever is later. Messages handled one after another
        (a worker's 25 pulled partitions) otherwise each count again the delay of the first late
        one, and the sum says the machine added 25 times what the step lost."""
        self.bytes_in += nbytes
        now = time.time() if arrived is None else arrived
        if self.nic is None or departure is None:
            return now
        due = self.nic.reserve_ingress(nbytes, departure)
        self.messages_in += 1
        if timed:
            start = max(due, self._last_arrival)
            if now > start:
                self.late_s += now - start
                self.late_messages += 1
            self._last_arrival = max(self._last_arrival, now)
        return due

    def deliveries(self, nbytes: int, departure: float | None, copies: Sequence[float] = (),
                   arrived: float | None = None) -> tuple[float, list[float]]:
        """A message and the copies of it that its sender's emulated peers sent, leaving at
        `copies` (testbed.emulation.peers): the ingress queues them all in departure order.
        Returns (the message's delivery, each copy's). Only the message itself can be late: the
        copies ride with it, computed."""
        if not copies:
            return self.delivery(nbytes, departure, arrived), []
        due = [0.0] * len(copies)
        own = 0.0
        for d, i in sorted([(departure, -1), *((d, i) for i, d in enumerate(copies))]):
            if i < 0:
                own = self.delivery(nbytes, d, arrived)
            else:
                due[i] = self.delivery(nbytes, d, arrived, timed=False)
        return own, due

    def finish(self, due: float) -> None:
        """A schedule computed at the model's times ends at `due` (or, the workers' common start,
        begins then): sleep until then. Being past it already is the lateness of the whole
        schedule: what this machine added to the model."""
        now = time.time()
        if now > due:
            self.late_s += now - due
            self.late_messages += 1
        sleep_until(due)

    def take_late(self) -> float:
        """Lateness since the last call (what a report carries)."""
        late, self._taken = self.late_s - self._taken, self.late_s
        return late

    def receive(self, nbytes: int, departure: float | None) -> None:
        """Account nbytes arriving; in emulation sleep until the message is delivered."""
        if self.nic is None:  # real mode: delivered on arrival
            self.bytes_in += nbytes
            return
        sleep_until(self.delivery(nbytes, departure))
