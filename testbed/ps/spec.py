"""What is true of the parameter server: `ps-sync` (optionally with backup workers) and
`ps-async` (optionally stale-synchronous). Pure: no Ray; the driver loop is `strategy.py`, the
servers `server.py` (a partition's logic `shard.py`), the worker side `worker.py`, the partitions `partition.py`.

ps-sync. Each version v: every worker computes on params_v and pushes each partition of its
gradient to that partition's server, asking for the partition's version v+1 back (push-pull). A
partition is averaged when it holds the gradients of N - b workers for v (`--backup-workers b`,
default 0; later ones for v are dropped and recorded, `dropped_gradients`), and its replies go
out at once, while the workers are still pushing later partitions. With b = 0 this equals
single-process SGD on the concatenated batch, partitioned or not. Per step a server moves
N*K*(its share) bytes in and as many out, so with few dedicated servers the servers' NICs are
the limit; with S = N dedicated servers and fine partitions a worker's own K in and K out,
overlapped, are (the BytePS argument); colocated servers add their traffic to their workers'
NICs. Cost: `testbed.analysis.psmodel` (steady-state push-pull pipeline; the no-overlap bound
2(a + N K/(S B)) of `costmodel` beside it for dedicated servers).

ps-async. No barrier: each pushed partition is applied the moment it arrives, so fast workers
never wait for slow ones, at the price of staleness: a gradient computed from version v_read
and applied at version v has staleness v - v_read (0 with one worker). `--steps` counts applied
gradients. `--staleness-bound s` adds the SSP rule: a worker may not start iteration c until
every worker has finished iteration c-s-1 (s = 0 is bulk synchronous); the time a fast worker
is held back is its wait, and the worker pulls when it starts, not with its push. Cost: the
run's schedule replayed on the NIC model (`testbed.ps.flow`: every worker starts at
once, so the first round queues at the servers' NICs), with SSP too; with a real model's
compute, one worker's round trip, a lower bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from testbed.analysis import costmodel, psmodel
from testbed.analysis.costmodel import NotModelled
from testbed.config import RunConfig, fail
from testbed.ps import flow
from testbed.ps.config import PSConfig
from testbed.ps.partition import partition_count
from testbed.strategies.contract import (
    Equivalence,
    Prediction,
    Strategy,
    StrategySpec,
    Variant,
)
from testbed.workloads import tiny

SUMMARY_KEYS = {
    "grad_bytes_logical": "bytes: the logical gradient K",
    "ps_shards": "count: server actors S (--ps-shards or --ps-servers)",
    "ps_partitions": "count: partitions M the parameters are cut into (testbed.ps.partition)",
    "workers_unreported": "list: workers whose actor was gone when the run ended (a lost node); "
                          "their NIC figures are left out",
    "ps_partition_bytes": "bytes: logical size of the largest partition",
    "ps_placement": "dedicated (servers on machines of their own) or colocated (server i on worker i's)",
    "nic_ingress_bytes_per_step": "map NIC -> logical bytes it received per model update (worker i's NIC "
                                  "carries colocated server i's traffic too)",
    "nic_egress_bytes_per_step": "map NIC -> logical bytes it sent per model update",
    "bottleneck_nic": "the NIC that carried the most bytes one way",
    "bottleneck_busy_frac": "emulated network: share of the training wall time the bottleneck NIC's busier "
                            "queue was transferring (1 = the link is the limit)",
    "server_busy_frac": "list per shard: share of the training wall time spent applying updates",
    "server_ingress_bytes_per_step": "list per shard: logical bytes received per model update",
    "server_egress_bytes_per_step": "list per shard: logical bytes sent per model update",
}


# Runs equal to one-process training (tests/ray/test_equivalence.py): momentum held by the servers,
# whole and split across two shards; the transformer's one-worker async run is sequential SGD;
# partitions spread over dedicated and colocated servers.
SYNC_EQUIVALENCE = (
    Equivalence(3, {**tiny.RESNET, "workload.optimizer": "momentum", "ps.shards": 2}),
    Equivalence(4, tiny.SYN),
    Equivalence(4, {**tiny.SYN, "ps.shards": 2, "ps.partition_mb": 0.002}),  # 5 partitions on 2 servers
    Equivalence(3, {**tiny.SYN, "ps.servers": 3, "ps.placement": "colocated", "ps.partition_mb": 0.002}),
    # emulated peers (testbed.emulation.peers): weights 3 and 2 over 5 partitions on 2 servers, and one
    # real worker standing for four
    Equivalence(5, {**tiny.SYN, "network.bandwidth": "10Gbit", "cluster.real_workers": 2, "ps.shards": 2,
                    "ps.partition_mb": 0.002}),
    Equivalence(4, {**tiny.SYN, "network.bandwidth": "10Gbit", "cluster.real_workers": 1}),
)
ASYNC_EQUIVALENCE = (
    Equivalence(1, {**tiny.LM, "workload.optimizer": "momentum", "workload.lr": 0.1}),  # state on the server
    Equivalence(1, tiny.SYN),  # one async worker is sequential SGD
)


# every server's call threads together on one machine: half of Linux's default pid_max (32,768),
# which bounds all of a machine's threads (each takes a pid); the workers and Ray have the rest
SERVER_THREADS = 16384


class PSSpec(StrategySpec):
    fault_kinds = ("kill", "hang", "nan", "sent")  # sent: dies once its push reached the servers
    family = "ps"
    sections = {"ps": PSConfig}  # its config section (testbed.ps.config)
    summary_keys = SUMMARY_KEYS

    def shell(self) -> type[Strategy]:
        from testbed.ps.strategy import ParameterServer  # the Ray shell, imported when a run starts
        return ParameterServer

    def cannot_share_processes(self, cfg: RunConfig) -> str | None:
        return None  # pushes and pulls are actor calls

    def cannot_emulate_peers(self, cfg: RunConfig) -> str | None:
        """ps-sync plays emulated peers (testbed.emulation.peers): a real worker pushes for its
        segment, and the servers, real, queue every copy. ps-async's peers run timelines of their
        own, played by the driver (testbed.ps.async_peers), at the compute the config says: the
        synthetic workload's, free-running (a staleness bound would need every peer's pulls).
        Backup workers would need a peer's own lateness, colocated servers a peer's NIC, and
        compression a copy's own residual."""
        if cfg.ps.placement != "dedicated" or cfg.ps.backup_workers or cfg.compression.kind != "none":
            return (f"plays emulated peers with dedicated servers, no backup workers, uncompressed (got "
                    f"--ps-placement {cfg.ps.placement}, --backup-workers {cfg.ps.backup_workers}, "
                    f"--compression {cfg.compression.kind})")
        if not self.sync and cfg.workload.real_compute:
            return (f"plays emulated peers with the synthetic workload, whose compute --compute-ms says (a "
                    f"peer's iterations are its own; {cfg.workload.name}'s compute is measured as it runs)")
        if not self.sync and cfg.ps.staleness_bound is not None:
            return (f"plays emulated peers free-running, without --staleness-bound (got "
                    f"{cfg.ps.staleness_bound}: every peer would pull at each start)")
        return None

    def messages_per_step(self, cfg: RunConfig) -> int | None:
        """A push and its reply per partition (the synthetic workload's, whose size the config
        says; a real model's is known once its workers are up)."""
        k = cfg.grad_bytes_logical
        if k is None:
            return None
        return 2 * partition_count(k, cfg.ps.partition_mb, cfg.ps.count, numel=k // 4 + 1)

    def __init__(self, *, sync: bool) -> None:
        self.sync = sync
        self.name = "ps-sync" if sync else "ps-async"
        self.equivalence = SYNC_EQUIVALENCE if sync else ASYNC_EQUIVALENCE
        own = "ps.backup_workers" if sync else "ps.staleness_bound"
        self.keys = frozenset({"ps.shards", "ps.servers", "ps.placement", "ps.partition_mb", own,
                               "faults.checkpoint_every", "compression"})

    def synchronous(self, cfg: RunConfig) -> bool:
        return self.sync

    def server_threads(self, cfg: RunConfig, partitions: int, servers: int) -> int:
        """A server's call threads, for `partitions` partitions: one for every push-pull (and
        pull) they can have in flight at once. Under ps-sync and SSP a call may wait for a version
        that other workers' pushes make, so each needs a thread of its own (fewer could
        deadlock; `threads_refused` says when the machine cannot give them). An asynchronous call
        waits for no other (it sleeps to its delivery, then to its reply's departure), so the
        `servers` share SERVER_THREADS, and past a server's share the rest wait in Ray's queue
        for a thread: late, which the run's lateness shows."""
        need = 2 * cfg.real_workers * max(1, partitions) + 4
        if self.sync or cfg.ps.staleness_bound is not None:
            return need
        return min(need, max(1, SERVER_THREADS // servers))

    def threads_refused(self, cfg: RunConfig, threads: list[int], nodes: int) -> str | None:
        """Why servers asking for `threads` call threads cannot start on one machine, or None:
        Ray starts all of an actor's threads with it, and every thread takes one of the machine's
        pids (Linux's default pid_max is 32,768), so past the budget a server's process aborts as
        it starts. Asynchronous servers are capped within it (`server_threads`); synchronous ones
        cannot be. A Ray cluster of several `nodes` spreads its servers: no limit here."""
        if sum(threads) <= SERVER_THREADS or nodes > 1:
            return None
        fewer = ("fewer real workers (--real-workers K; on an emulated network auto plays the others)"
                 if self.cannot_emulate_peers(cfg) is None else "fewer --workers")
        return (f"{self.name}: {len(threads)} server(s) need {sum(threads):,} call threads, one for each push-pull "
                f"of {cfg.real_workers} real workers that may wait for a version, more than the {SERVER_THREADS:,} "
                f"one machine can give them; use {fewer} or larger partitions (--ps-partition-mb)")

    def servers(self, cfg: RunConfig) -> int:
        return cfg.ps.count

    def colocated_servers(self, cfg: RunConfig) -> bool:
        return cfg.ps.placement == "colocated"

    def validate(self, cfg: RunConfig) -> None:
        ps = cfg.ps
        if self.sync and ps.backup_workers >= cfg.workers:
            fail("ps.backup_workers", ps.backup_workers, f"must be smaller than --workers "
                 f"({cfg.workers}) so that some gradients are applied")
        if ps.servers is not None and ps.shards not in (1, ps.servers):
            fail("ps.servers", ps.servers, f"contradicts --ps-shards {ps.shards} (both count the server "
                 "actors); give one of them")
        if ps.placement == "colocated" and ps.count > cfg.workers:
            fail("ps.placement", ps.placement, f"puts server i beside worker i, so it needs at most "
                 f"--workers ({cfg.workers}) servers, not {ps.count}; use fewer servers or dedicated")

    def map_variants(self, cfg: RunConfig) -> list[Variant]:
        """ps-sync: k = 1, N/4, N/2 and N servers (the ends of docs/placement.md's axis and two
        between), dedicated and colocated, partitioned (cfg's --ps-partition-mb, 4 MiB by default)
        and not (0). ps-async: the same k, dedicated and partitioned, free-running and under SSP
        (cfg's --staleness-bound, else 1: the least bound that lets a worker run ahead; 0 is BSP).
        Asynchronous updates are stale, so they are not `exact`."""
        n, mb = cfg.workers, cfg.ps.partition_mb or 4.0
        ks = {}  # k -> its name relative to N, so that one label means one placement at every N
        for name, k in (("1", 1), ("N/4", n // 4), ("N/2", n // 2), ("N", n)):
            ks.setdefault(max(1, k), name)
        if self.sync:
            return [Variant({"ps.servers": k, "ps.placement": where, "ps.partition_mb": part},
                            f"{self.name} k={name} {where}, " + (f"{part:g} MiB partitions" if part else "unpartitioned"))
                    for k, name in ks.items() for where in ("dedicated", "colocated") for part in (mb, 0.0)]
        bound = cfg.ps.staleness_bound if cfg.ps.staleness_bound is not None else 1
        return [Variant({"ps.servers": k, "ps.partition_mb": mb, "ps.staleness_bound": s},
                        f"{self.name} k={name}" + ("" if s is None else f" SSP s={s}"), exact=False,
                        kind=self.name + ("" if s is None else f" SSP s={s}"), per_gradient=True)  # k: where bytes go
                for k, name in ks.items() for s in (None, bound)]

    def predict(self, cfg: RunConfig, resolved: Mapping[str, Any], latency: float,
                bandwidth: float) -> Prediction:
        n, s, k = cfg.workers, cfg.ps.count, resolved["grad_bytes_logical"]
        # the run's partition count (fewer when the real arrays have fewer elements), else the config's
        m = resolved.get("ps_partitions") or partition_count(k, cfg.ps.partition_mb, s, numel=int(k) // 4 + 1)
        if m < s:
            raise NotModelled(f"{m} partitions for {s} servers (the arrays have fewer elements than there "
                              "are servers): some servers hold nothing, which the model does not describe")
        colocated = self.colocated_servers(cfg)
        push = cfg.compression.wire_bytes(k)
        tail = ("" if push == k else " (P: compressed push bytes)") + (" colocated" if colocated else "")
        args = (n, k, latency, bandwidth, s, m, colocated, push)
        if not self.sync:
            bound = cfg.ps.staleness_bound
            if bound is not None:  # pull at the start (worker.py)
                lone = costmodel.ps_async_comm_s(n, k, latency, bandwidth, shards=s, push=push)
                said = "2*a + (P+K)/(S*B)"
            else:
                lone = psmodel.ps_async_partitioned_comm_s(*args)
                said = f"2*a + (min(P,K) + R*max(P,K))/(M*B), M={m}"
            if cfg.workload.real_compute:  # the replay needs the compute time, measured only by the run
                return Prediction(lone, f"{said}: one worker's round trip (lower bound, no contention: a real "
                                  "model's compute is not known before it runs)" + tail)
            return Prediction(flow.ps_async_run_comm_s(*args, cfg.workload.compute_ms / 1000.0, cfg.steps, bound),
                              "the run's pushes, replies" + (" and pulls (SSP)" if bound is not None else "")
                              + f" replayed on the NIC model, M={m} partitions on S={s} servers "
                              f"(testbed.ps.flow); one worker alone: {lone * 1e3:.4g} ms" + tail)
        upper = None if colocated else costmodel.ps_sync_comm_s(n, k, latency, bandwidth, shards=s, push=push)
        return Prediction(psmodel.ps_partitioned_comm_s(*args),
                          f"2*a + (pipeline fill + busiest NIC) in units of K/(M*B), M={m} partitions "
                          f"on S={s} servers (testbed.analysis.psmodel)" + tail, upper)

    def bytes_per_worker(self, cfg: RunConfig, resolved: Mapping[str, Any]) -> float:
        """A worker pushes its (compressed) gradient slices, K (or P) bytes in all."""
        return cfg.compression.wire_bytes(resolved["grad_bytes_logical"])


PS_SYNC = PSSpec(sync=True)
PS_ASYNC = PSSpec(sync=False)
