"""One endpoint's view of the (optionally emulated) network: send stamps, receive waits.

In real mode (`--bandwidth` unset) both calls are free no-ops and only logical bytes are
counted. In emulated mode the endpoint owns a `network.Nic`: `send` queues the message on the
egress and returns the departure stamp that travels with the message; `receive` queues it on
the receiver's ingress and sleeps until delivery. Wall-clock stamps (time.time) are shared by all
processes of one machine; across machines they assume synchronised clocks.
"""

from __future__ import annotations

import time

from testbed.config import NetworkConfig
from testbed.emulation.network import LinkSpec, Nic, sleep_until


class Endpoint:
    def __init__(self, net: NetworkConfig, name: str) -> None:
        self.nic = Nic(LinkSpec(net.bandwidth_Bps, net.latency_s), name) if net.emulated else None
        self.bytes_out = 0
        self.bytes_in = 0

    @property
    def emulated(self) -> bool:
        return self.nic is not None

    def send(self, nbytes: int) -> float | None:
        """Queue nbytes on the egress; return the departure stamp that travels with the message.

        The sender does not sleep: its egress reservation alone delays its later messages, and
        the receiver waits until delivery. So real transport latency (a Ray call takes about a
        millisecond here) hides inside the emulated a + n/B instead of adding to it.
        """
        self.bytes_out += nbytes
        if self.nic is None:
            return None
        return self.nic.reserve_egress(nbytes, time.time())[0]

    def delivery(self, nbytes: int, departure: float | None) -> float:
        """Reserve the ingress for a message; return when it is delivered (now in real mode)."""
        self.bytes_in += nbytes
        if self.nic is None or departure is None:
            return time.time()
        return self.nic.reserve_ingress(nbytes, departure)

    def receive(self, nbytes: int, departure: float | None) -> None:
        """Account nbytes arriving; in emulation sleep until the message is delivered."""
        sleep_until(self.delivery(nbytes, departure))
