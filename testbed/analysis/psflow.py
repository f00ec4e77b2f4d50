"""ps-async as a run plays it: N workers, S servers, M partitions on the NIC model. Pure.

A lone worker's round trip (``psmodel.ps_async_partitioned_comm_s``) is a lower bound that a run
meets only when its workers never meet at a server. They do: every worker starts at once, pulls
the whole model (it holds no parameters yet), computes and pushes, so a server sends and then
receives K/S bytes for each of N workers, at B. With N K/(S B) above the round trip the servers'
NICs set the pace, and a short run is all first round (`--steps 4` at N = 64: 64 first
iterations for 4 updates). So the cost model replays the run's schedule message by message on
fresh NICs (``network.Flows``: the emulator's own queue arithmetic), with the driver's rule:

    iteration 0     pull: every server sends the worker its partitions (requests are free);
                    compute C once the last has landed
    each iteration  push partitions 0..M-1 back to back on the worker's egress (those of its
                    own server, colocated, skip the network); a push is applied the moment it
                    lands and its reply (K/M bytes) queued on the server's egress; the
                    iteration ends on the worker's last reply, and the next one computes C on it
    the driver      counts an update when an iteration ends whose push of partition 0 was among
                    the first `steps` to land there (a partition takes `steps` versions); a
                    worker whose iteration ends while fewer are counted starts its next one

    comm of an iteration = (its pull, iteration 0) + (last reply - end of compute)

The prediction is the mean over the simulated iterations, which is what `comm_s_per_step` of an
asynchronous run measures (the mean of its step rows). Compute is exactly C and servers apply
in no time: what a run adds beyond this is this machine's, and its lateness says so. A long run
would need as many events: after about ``MAX_MESSAGES`` messages (at least two rounds of N
iterations) the replay stops and the iterations left are taken at the mean of its last N.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from testbed.emulation.network import Flows, LinkSpec

MAX_MESSAGES = 200_000  # replayed (about 1.5 s) before the rest are taken at the mean of the last N

Then = Callable[[float], None]


def _after_all(count: int, done: Then) -> Then:
    """A continuation for each of `count` messages that calls done(last delivery) after the last."""
    state = {"left": count, "last": float("-inf")}

    def one(t: float) -> None:
        state["left"] -= 1
        state["last"] = max(state["last"], t)
        if state["left"] == 0:
            done(state["last"])
    return one


class _Replay:
    def __init__(self, n: int, k: float, a: float, b: float, servers: int, partitions: int,
                 colocated: bool, push: float, compute_s: float, steps: int) -> None:
        self.flows = Flows(LinkSpec(bandwidth=b, latency=a))
        self.n, self.compute_s, self.steps = n, compute_s, steps
        self.reply, self.push_bytes = k / partitions, push / partitions
        self.server = [("w", p % servers) if colocated else ("s", p % servers) for p in range(partitions)]
        self.landed = 0  # pushes of partition 0 applied or refused (its versions)
        self.counted = 0  # updates the driver has counted
        self.comms: list[float] = []
        self.limit = max(2 * n, MAX_MESSAGES // (2 * partitions))  # iterations replayed

    def remote(self, w: int) -> list[int]:
        """The partitions worker w exchanges over the network (not its own colocated server's)."""
        return [p for p, s in enumerate(self.server) if s != ("w", w)]

    def start(self) -> float:
        for w in range(self.n):
            self.pull(w, 0.0)
        self.flows.run()
        return self.mean()

    def pull(self, w: int, t0: float) -> None:
        def pulled(t: float) -> None:
            self.flows.at(t + self.compute_s, lambda tc: self.push(w, tc, t - t0))
        parts = self.remote(w)
        if not parts:
            pulled(t0)
            return
        one = _after_all(len(parts), pulled)
        for p in parts:
            self.flows.send(self.server[p], ("w", w), self.reply, t0, one)

    def land(self) -> bool:
        """A push of partition 0 lands: whether it is applied (one of the first `steps`)."""
        self.landed += 1
        return self.landed <= self.steps

    def push(self, w: int, t_push: float, pull_s: float) -> None:
        applied = [False]

        def ended(t: float) -> None:
            self.comms.append(pull_s + t - t_push)
            self.counted += applied[0]
            if self.counted < self.steps and len(self.comms) < self.limit:
                self.flows.at(t + self.compute_s, lambda tc: self.push(w, tc, 0.0))

        parts = self.remote(w)
        if 0 not in parts:  # partition 0 is on this worker's own server
            applied[0] = self.land()
        if not parts:
            self.flows.at(t_push, ended)
            return
        one = _after_all(len(parts), ended)

        def send(p: int) -> None:
            def at_server(t: float) -> None:
                if p == 0:
                    applied[0] = self.land()
                self.flows.send(self.server[p], ("w", w), self.reply, t, one)
            self.flows.send(("w", w), self.server[p], self.push_bytes, t_push, at_server)
        for p in parts:
            send(p)

    def mean(self) -> float:
        done, rest = len(self.comms), max(0, self.steps - self.counted)
        if rest == 0 or done < self.limit:
            return sum(self.comms) / done
        tail = self.comms[-self.n:]
        return (sum(self.comms) + rest * sum(tail) / len(tail)) / (done + rest)


@functools.lru_cache(maxsize=256)
def ps_async_run_comm_s(n: int, k: float, a: float, b: float, servers: int, partitions: int,
                        colocated: bool, push: float, compute_s: float, steps: int) -> float:
    """Mean communication per iteration of an asynchronous PS run of `steps` updates (above)."""
    if min(n, servers, steps) < 1 or partitions < servers:
        raise ValueError(f"n={n}, servers={servers}, partitions={partitions}, steps={steps}: need "
                         f"n, servers and steps >= 1 and partitions >= servers; e.g. partitions={servers}")
    if colocated and servers > n:
        raise ValueError(f"servers {servers}: colocated servers share worker NICs, so at most n ({n}); e.g. {n}")
    return _Replay(n, k, a, b, servers, partitions, colocated, push, compute_s, steps).start()
