"""ps-async as a run plays it: N workers, S servers, M partitions on the NIC model. Pure.

A lone worker's round trip (``psmodel.ps_async_partitioned_comm_s``) is a lower bound that a run
meets only when its workers never meet at a server. They do: every worker starts at once on the
servers' version 0 and pushes when it has computed, so a server receives and then sends K/S
bytes for each of N workers, at B. With N K/(S B) above the round trip the servers' NICs set
the pace, and a short run is all first round (`--steps 4` at N = 64: 64 first iterations for 4
updates). So the cost model replays the run's schedule message by message on fresh NICs
(``network.Flows``: the emulator's own queue arithmetic), with the driver's rule:

    each iteration  compute C, then push partitions 0..M-1 back to back on the worker's egress
                    (those of its own server, colocated, skip the network); a push is applied
                    the moment it lands and its reply (K/M bytes) queued on the server's egress;
                    the iteration ends on the worker's last reply, the next computes on it
    under SSP (s)   iteration c starts once every worker has finished c - s - 1 (the driver
                    starts the workers it held, in worker order, when the last of those ends);
                    from the second on, an iteration first pulls every partition (the servers
                    send them at its start: requests are free), and its pushes carry no reply:
                    it ends when the last lands
    who goes first  pushes that leave at the same instant (every worker's first, in the replay)
                    reach a server in a random order, drawn anew for every partition: in a run
                    it is the jitter of processes waking up, which puts no worker first at
                    every server (were it worker order everywhere, worker 0 would always end
                    first and the driver would stop starting iterations sooner than any run
                    does). Seeded: the prediction is a function of the config
    the driver      counts an update when an iteration ends whose push of partition 0 was among
                    the first `steps` to land there (a partition takes `steps` versions); every
                    worker runs a first iteration, and one whose iteration ends starts its next
                    while the updates counted plus the iterations in flight are fewer than
                    `steps` (testbed.ps.strategy)

    comm of an iteration = its pull (SSP) + (end - end of compute)

The prediction is the mean over the simulated iterations, which is what `comm_s_per_step` of an
asynchronous run measures (the mean of its step rows); the time a worker is held back by the
bound is its wait, not communication. Compute is exactly C and servers apply in no time: what a
run adds beyond this is this machine's, and its lateness says so. A long run would need as many
events: after about ``MAX_MESSAGES`` messages (at least two rounds of N iterations) the replay
stops and the iterations left are taken at the mean of its last N. And fine partitions cost as
many messages (BERT-Large's 1.3 GB in 4 MiB is 320 a push): past ``MAX_PARTS`` the replay moves
them in M' = S floor(MAX_PARTS/S) partitions (at least S), each server the same bytes. What that
changes is the pipeline's fill and drain, a partition's K/(M B) against K/(M' B): 1/32 of K/B
at most, where the queues at the servers are N K/(S B).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable

from testbed.emulation.network import Flows, LinkSpec
from testbed.ps.ssp import ssp_may_start

MAX_MESSAGES = 200_000  # replayed before the rest are taken at the mean of the last N
MAX_PARTS = 32  # partitions replayed per worker: more are merged, S at a time (below)

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
                 colocated: bool, push: float, compute_s: float, steps: int, bound: int | None) -> None:
        self.flows = Flows(LinkSpec(bandwidth=b, latency=a))
        self.n, self.compute_s, self.steps, self.bound = n, compute_s, steps, bound
        self.reply, self.push_bytes = k / partitions, push / partitions
        self.server = [("w", p % servers) if colocated else ("s", p % servers) for p in range(partitions)]
        self.landed = 0  # pushes of partition 0 applied or refused (its versions)
        self.counted = 0  # updates the driver has counted
        self.completed = [0] * n  # iterations each worker has finished
        self.held: list[int] = []  # idle workers: the bound (SSP) or the driver's rule holds them
        self.running = n  # iterations in flight
        self.comms: list[float] = []
        self.jitter = random.Random(0)  # who is first, among pushes that leave together (above)
        self.limit = max(2 * n, MAX_MESSAGES // (2 * partitions))  # iterations replayed

    def remote(self, w: int) -> list[int]:
        """The partitions worker w exchanges over the network (not its own colocated server's)."""
        return [p for p, s in enumerate(self.server) if s != ("w", w)]

    def start(self) -> float:
        for w in range(self.n):  # on version 0, which every worker holds
            self.flows.at(self.compute_s, lambda tc, w=w: self.push(w, tc, 0.0))
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
            self.completed[w] += 1
            self.next(w, t)

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
                if self.bound is None:
                    self.flows.send(self.server[p], ("w", w), self.reply, t, one)
                else:
                    one(t)
            self.flows.send(("w", w), self.server[p], self.push_bytes, t_push, at_server, self.jitter.random())
        for p in parts:
            send(p)

    def next(self, w: int, t: float) -> None:
        """Worker w's iteration ended at t: what the driver starts now."""
        self.running -= 1
        if len(self.comms) >= self.limit:
            return
        self.held.append(w)
        for v in sorted(self.held):
            if self.counted + self.running >= self.steps:
                return
            if self.bound is None:  # it computes on the parameters its replies brought
                self.held.remove(v)
                self.running += 1
                self.flows.at(t + self.compute_s, lambda tc, v=v: self.push(v, tc, 0.0))
            elif ssp_may_start(self.completed[v], self.completed, self.bound):
                self.held.remove(v)
                self.running += 1
                self.pull(v, t)

    def mean(self) -> float:
        done, rest = len(self.comms), max(0, self.steps - self.counted)
        if rest == 0 or done < self.limit:
            return sum(self.comms) / done
        tail = self.comms[-self.n:]
        return (sum(self.comms) + rest * sum(tail) / len(tail)) / (done + rest)


@functools.lru_cache(maxsize=256)
def ps_async_run_comm_s(n: int, k: float, a: float, b: float, servers: int, partitions: int,
                        colocated: bool, push: float, compute_s: float, steps: int,
                        bound: int | None = None) -> float:
    """Mean communication per iteration of an asynchronous PS run of `steps` updates, under the
    staleness bound `bound` (SSP) if not None (above)."""
    if min(n, servers, steps) < 1 or partitions < servers or (bound is not None and bound < 0):
        raise ValueError(f"n={n}, servers={servers}, partitions={partitions}, steps={steps}, bound={bound}: "
                         "need n, servers and steps >= 1, partitions >= servers and bound >= 0; "
                         f"e.g. partitions={servers}")
    if colocated and servers > n:
        raise ValueError(f"servers {servers}: colocated servers share worker NICs, so at most n ({n}); e.g. {n}")
    if partitions > MAX_PARTS:
        partitions = servers * max(1, MAX_PARTS // servers)
    return _Replay(n, k, a, b, servers, partitions, colocated, push, compute_s, steps, bound).start()
