r"""ps-async's emulated peers: each runs its own iterations at the model's times. Pure: no Ray.

Under ps-sync an emulated peer rides its real owner's push (testbed.emulation.peers: the owner
sends the peer's departures with its own gradient, and a version waits for everyone). An
asynchronous peer cannot: it is applied the moment it lands, its reply comes back when its own
copies are through the servers' queues, and it starts its next iteration then -- its own
timeline, which is no other worker's. So ps-async's peers are played in one place, the driver
(`PeerPlayer`, the Ray side, in testbed.ps.strategy), and the servers apply their copies:

    driver (this module)                         server s (testbed.ps.server, its peer thread)
      peer x starts iteration c at t0 (its
      last reply, or the run's common start);
      its compute ends at e = t0 + C_x(c)
      its partitions leave its egress back to
      back from e: departure d_p  ------------>  entries (p, x, c, d_p, version x read)
                                                 at d_p: the ingress queues the copy (beside
                                                   the real workers' pushes, which reach it
                                                   at their departures too)
                                                 at its delivery: apply x's owner's newest
                                                   gradient of p, as worker x's iteration c;
                                                   queue the reply on the egress: r_p
                           notices  <------------  (p, x, c, status, staleness, r_p, ...)
      when all M notices of (x, c) are in:
      x's ingress takes the replies in
      departure order; end = the last delivery
      at end: the iteration is over (a step
      row of its own, `emulated`), and x starts
      its next one if the driver's rule allows

What a peer is (the rest is testbed.emulation.peers):
- its compute C_x(c) is --compute-ms with its own straggler draws (worker x of --straggler),
  from when it held its last reply: the synthetic workload's, whose compute the config says (a
  real model's is measured as it runs, so its ps-async runs have every worker real);
- its gradient is its owner's newest that reached the server, applied as the peer's: it counts
  as one update, at the version the server is at, with staleness that version minus the one the
  peer last read there (what a real worker's push would say);
- it counts in the driver's rule as a worker of its own: every worker's first iteration starts
  at the common start; one that ends starts its next while the updates counted plus the
  iterations in flight are fewer than --steps (testbed.ps.flow replays the same rule);
- its iterations are step rows with `emulated` true (an asynchronous run's measures are means
  over every worker's iterations, so a peer that kept none would leave 15 of 16 out at K = N/16).

Cost: a peer's iteration is M entries to the servers (batched: one call per server for every
peer that starts within a window), M applications in the servers' peer threads and M notices
back (batched the same way), where a real worker makes 2 M actor calls.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from testbed.emulation.network import LinkSpec, Nic
from testbed.emulation.peers import owner, real_positions
from testbed.ps.shard import push_staleness

# an entry a server plays: (partition, position, owner's position, iteration, departure, version read)
Entry = tuple[int, int, int, int, float, int]


@dataclass(frozen=True)
class Notice:
    """What a server did with one peer copy: a partition's ack, as a real push's."""

    part: int
    position: int
    iteration: int
    status: str  # applied / finished / nan / duplicate / stale-epoch (ShardState.push)
    version_applied: int | None
    staleness: int | None
    version: int  # the partition's version the reply carries (what the peer reads next)
    departure: float  # the reply's, on the server's egress
    loss: float
    samples: int
    update: dict[str, Any] | None = None  # partition 0: the update record, where it was applied


@dataclass
class _Iteration:
    c: int
    t_start: float
    compute_s: float
    injected_s: float
    t_push: float
    read: list[int]
    notices: dict[int, Notice] = field(default_factory=dict)


@dataclass(frozen=True)
class Done:
    """A peer iteration that ended: its step row's fields and what the driver counts."""

    position: int
    iteration: int
    t_start: float
    compute_s: float
    injected_s: float
    comm_s: float
    t_end: float
    version_read: int
    version_applied: int | None
    loss: float
    samples: int
    bytes_sent: int
    bytes_recv: int
    update: dict[str, Any] | None  # partition 0's update record, where this push made one

    def report(self) -> dict[str, Any]:
        """The iteration as a worker's report (testbed.analysis.records.step_record), marked emulated."""
        return {"t_start": self.t_start, "compute_s": self.compute_s, "comm_s": self.comm_s,
                "bytes_sent": self.bytes_sent, "bytes_recv": self.bytes_recv, "samples": self.samples,
                "loss": self.loss, "injected_delay_s": self.injected_s, "emulated": True}


class AsyncPeers:
    """Every emulated peer's timeline (see the module docstring). `compute(x, c)`: peer x's
    compute and injected delay in iteration c, seconds on this machine's clock (dilated)."""

    def __init__(self, n: int, k: int, part_bytes: Sequence[int], server_of: Sequence[int], link: LinkSpec,
                 compute: Callable[[int, int], tuple[float, float]]) -> None:
        real = set(real_positions(n, k))
        self.positions = [x for x in range(n) if x not in real]
        self.owner = {x: owner(n, k, x) for x in self.positions}
        self.part_bytes, self.server_of = list(part_bytes), list(server_of)
        self.compute = compute
        self.nics = {x: Nic(link, f"worker{x}", one_thread=True) for x in self.positions}
        self.next_iter = dict.fromkeys(self.positions, 0)
        self.read = {x: [0] * len(self.part_bytes) for x in self.positions}  # versions each holds
        self.flight: dict[int, _Iteration] = {}  # position -> its iteration in flight
        self.ends: list[tuple[float, int]] = []  # (end, position) of iterations whose replies are in
        self.held: list[int] = []  # idle: the driver's rule holds them

    @property
    def running(self) -> int:
        """Iterations in flight (pushed, not yet ended)."""
        return len(self.flight)

    def start(self, x: int, t0: float) -> dict[int, list[Entry]]:
        """Peer x begins its next iteration at t0: the entries each server plays for it."""
        c = self.next_iter[x]
        compute_s, injected_s = self.compute(x, c)
        t_push = t0 + compute_s + injected_s
        out: dict[int, list[Entry]] = {}
        for p, nbytes in enumerate(self.part_bytes):
            departure = self.nics[x].reserve_egress(nbytes, t_push)[0]
            out.setdefault(self.server_of[p], []).append(
                (p, x, self.owner[x], c, departure, self.read[x][p]))
        self.flight[x] = _Iteration(c, t0, compute_s, injected_s, t_push, list(self.read[x]))
        return out

    def take(self, notices: Sequence[Notice]) -> None:
        """Servers' notices; an iteration whose every partition has answered ends where its
        peer's ingress, taking the replies in departure order, delivers the last."""
        for note in notices:
            it = self.flight.get(note.position)
            if it is None or it.c != note.iteration:
                raise ValueError(f"peer {note.position}: a notice of iteration {note.iteration}, "
                                 f"which is not in flight")
            it.notices[note.part] = note
            if len(it.notices) == len(self.part_bytes):
                nic = self.nics[note.position]
                end = max(nic.reserve_ingress(self.part_bytes[n.part], n.departure)
                          for n in sorted(it.notices.values(), key=lambda n: (n.departure, n.part)))
                heapq.heappush(self.ends, (end, note.position))

    def next_end(self) -> float | None:
        return self.ends[0][0] if self.ends else None

    def ended(self, until: float) -> list[Done]:
        """The iterations that end by `until`, in end order; their peers are idle after."""
        out = []
        while self.ends and self.ends[0][0] <= until:
            end, x = heapq.heappop(self.ends)
            it = self.flight.pop(x)
            self.next_iter[x] = it.c + 1
            acks = [{"status": n.status, "staleness": n.staleness, "version_applied": n.version_applied}
                    for _, n in sorted(it.notices.items())]
            stalest = push_staleness(acks)
            self.read[x] = [it.notices[p].version for p in range(len(self.part_bytes))]
            first = it.notices[0]
            out.append(Done(x, it.c, it.t_start, it.compute_s, it.injected_s, end - it.t_push, end,
                            it.read[0], None if stalest is None else it.read[0] + stalest,
                            first.loss, first.samples, sum(self.part_bytes), sum(self.part_bytes),
                            first.update))
            self.held.append(x)
        return out

    def take_held(self, room: int) -> list[int]:
        """Up to `room` idle peers to start, in position order."""
        self.held.sort()
        out, self.held = self.held[:max(0, room)], self.held[max(0, room):]
        return out
