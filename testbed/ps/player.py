"""The driver's side of ps-async's emulated peers: `AsyncPeers` (testbed.ps.async_peers, the
timelines) wired to the servers by batched actor calls. The driver loop (testbed.ps.strategy)
waits on `polls` beside its workers' iterations, hands each answered poll to `take`, and asks
`ended` for the iterations whose end has come.

Batching. Each server has at most one `peer_notices` call open, which returns the notices of a
`gather` window at once; the entries of the peers that start within that window go to each
server in one `peer_push`. The window is a quarter of the slack a notice has before it matters
(a peer's next push leaves its compute after its last reply: C + a), at least 2 ms: a peer
iteration decided up to that early starts at its own times all the same (the driver's rule is
then applied a little before its end, which moves no emulated time).
"""

from __future__ import annotations

import time
from typing import Any

import ray

from testbed.config import RunConfig
from testbed.emulation.network import LinkSpec
from testbed.emulation.stragglers import StragglerModel
from testbed.ps.async_peers import AsyncPeers, Done, Entry
from testbed.ps.partition import Partitioning
from testbed.runtime import remote


class PeerPlayer:
    def __init__(self, cfg: RunConfig, shards: list[Any], parts: Partitioning, logical_factor: float) -> None:
        assert cfg.network.wire is not None, "emulated peers need an emulated network (validation says so)"
        link = LinkSpec(*cfg.network.wire)
        d = cfg.network.factor
        compute = cfg.workload.compute_ms / 1000.0 * d  # the synthetic workload's, dilated as a worker's
        stragglers = StragglerModel(cfg.straggler.items, cfg.seed, dilation=d)

        def compute_of(x: int, c: int) -> tuple[float, float]:
            return compute, (stragglers.factor(x) - 1.0) * compute + stragglers.additive(x, c) * d

        self.peers = AsyncPeers(cfg.workers, cfg.real_workers, parts.logical_bytes(logical_factor), parts.server_of,
                                link, compute_of)
        self.shards, self.timeout = shards, cfg.cluster.timeout_s
        self.gather = max(0.002, 0.25 * (compute + link.latency))
        self.polls: dict[Any, int] = {}  # open peer_notices call -> its server
        self.waiting = [0] * len(shards)  # copies each server has not answered yet
        self.pushes: list[Any] = []
        self.free_at: dict[int, float] = {}  # an idle peer: when its last iteration ended
        self.fresh: set[int] = set()  # idle peers whose iteration ended since the rule was last applied

    @property
    def running(self) -> int:
        return self.peers.running

    def start_all(self, t0: float) -> None:
        """Every peer's first iteration, from the workers' common start."""
        self._push([self.peers.start(x, t0) for x in self.peers.positions])

    def start_held(self, room: int, now: float) -> int:
        """Start up to `room` idle peers (the driver's rule). One whose iteration ended since the
        last call starts where it ended, in the model (the driver learns of an end a batch of
        notices later, and a peer started then would push less often than the model's workers,
        so that a run of several rounds would measure below the model); one the rule held
        starts now, when room came. Returns how many started."""
        xs = self.peers.take_held(room)
        self._push([self.peers.start(x, self.free_at.pop(x) if x in self.fresh else max(self.free_at.pop(x), now))
                    for x in xs])
        self.fresh.clear()  # the rest wait for room
        return len(xs)

    def _push(self, started: list[dict[int, list[Entry]]]) -> None:
        batches: dict[int, list[Entry]] = {}
        for one in started:
            for s, entries in one.items():
                batches.setdefault(s, []).extend(entries)
        for s, entries in batches.items():
            self.pushes.append(self.shards[s].peer_push.remote(entries, self.timeout))
            self.waiting[s] += len(entries)
            if s not in self.polls.values():
                self.polls[self.shards[s].peer_notices.remote(self.timeout, self.gather)] = s
        if len(self.pushes) > 64:  # their errors surface here, not only at the end
            done, self.pushes = ray.wait(self.pushes, num_returns=len(self.pushes), timeout=0)
            remote.get(done, self.timeout, "peer copies")

    def take(self, ref: Any) -> int:
        """An answered poll: its notices to the timelines, and the poll again while that server
        still owes some. Returns how many notices it carried (0: none within --timeout)."""
        s = self.polls.pop(ref)
        notices = remote.get(ref, self.timeout, f"PS server {s}'s emulated peers")
        self.waiting[s] -= len(notices)
        self.peers.take(notices)
        if self.waiting[s] > 0:
            self.polls[self.shards[s].peer_notices.remote(self.timeout, self.gather)] = s
        return len(notices)

    def next_due(self) -> float | None:
        """When `ended` next has something (up to `gather` before an iteration's end)."""
        end = self.peers.next_end()
        return None if end is None else end - self.gather

    def ended(self, now: float | None = None) -> list[Done]:
        done = self.peers.ended((time.time() if now is None else now) + self.gather)
        for d in done:
            self.free_at[d.position] = d.t_end
            self.fresh.add(d.position)
        return done

    def finish(self) -> None:
        """The run is over: the servers took every push (an error in one surfaces here)."""
        remote.get(self.pushes, self.timeout, "peer copies")
