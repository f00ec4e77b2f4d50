"""What is true of the parameter server: `ps-sync` (optionally with backup workers) and
`ps-async` (optionally stale-synchronous). Pure: no Ray; the driver loop is `strategy.py`, the
shards `server.py`, the worker side `worker.py`.

ps-sync. Each version v: every worker pulls params_v (the pull blocks until v is applied),
computes its gradient and pushes it to every shard. A shard applies one averaged update when
it holds the gradients of N - b workers for v (`--backup-workers b`, default 0) and drops later
ones for v (recorded, `dropped_gradients`). With b = 0 this equals single-process SGD on the
concatenated batch. Per step a shard moves N*K/S bytes in and N*K/S out: 2(a + N K/(S B)) in the
alpha-beta model, linear in N for a fixed number of shards (pipelined on full-duplex NICs:
2a + (N + 2S - 1) K/(S B); `testbed.analysis.costmodel`).

ps-async. No barrier: each pushed gradient is applied the moment it arrives, so fast workers
never wait for slow ones, at the price of staleness: a gradient computed from version v_read
and applied at version v has staleness v - v_read (0 with one worker). `--steps` counts applied
gradients. `--staleness-bound s` adds the SSP rule: a worker may not start iteration c until
every worker has finished iteration c-s-1 (s = 0 is bulk synchronous); the time a fast worker
is held back is its wait. Cost per applied gradient: one worker round trip, 2(a + K/(S B)), as
a lower bound -- pushes still contend at the shards' NICs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from testbed.analysis import costmodel
from testbed.config import RunConfig, fail
from testbed.strategy import Prediction, StrategySpec

SUMMARY_KEYS = {
    "grad_bytes_logical": "bytes: the logical gradient K",
    "ps_shards": "count: server shards S",
    "server_busy_frac": "list per shard: share of the training wall time spent applying updates",
    "server_ingress_bytes_per_step": "list per shard: logical bytes received per model update",
    "server_egress_bytes_per_step": "list per shard: logical bytes sent per model update",
}


class PSSpec(StrategySpec):
    family = "ps"
    runner = "testbed.ps.strategy:ParameterServer"
    summary_keys = SUMMARY_KEYS

    def __init__(self, *, sync: bool) -> None:
        self.sync = sync
        self.name = "ps-sync" if sync else "ps-async"
        own = "ps.backup_workers" if sync else "ps.staleness_bound"
        self.keys = frozenset({"ps.shards", own, "faults.checkpoint_every", "compression"})

    def synchronous(self, cfg: RunConfig) -> bool:
        return self.sync

    def servers(self, cfg: RunConfig) -> int:
        return cfg.ps.shards

    def validate(self, cfg: RunConfig) -> None:
        if self.sync and cfg.ps.backup_workers >= cfg.workers:
            fail("ps.backup_workers", cfg.ps.backup_workers, f"must be smaller than --workers "
                 f"({cfg.workers}) so that some gradients are applied")

    def predict(self, cfg: RunConfig, resolved: Mapping[str, Any], latency: float,
                bandwidth: float) -> Prediction:
        n, s, k = cfg.workers, cfg.ps.shards, resolved["grad_bytes_logical"]
        push = cfg.compression.wire_bytes(k)
        tail = "" if push == k else " (P: compressed push bytes)"
        if not self.sync:
            comm = costmodel.ps_async_comm_s(n, k, latency, bandwidth, shards=s, push=push)
            return Prediction(comm, "2*a + (P+K)/(S*B) (lower bound, no contention)" + tail)
        comm = costmodel.ps_sync_pipelined_comm_s(n, k, latency, bandwidth, shards=s, push=push)
        upper = costmodel.ps_sync_comm_s(n, k, latency, bandwidth, shards=s, push=push)
        formula = "2*a + (N+2*S-1)*K/(S*B) (pipelined)" if push == k else \
            "2*a + (N+S-1)*K/(S*B) + P/B (pipelined)"
        return Prediction(comm, formula + tail, upper)

    def bytes_per_worker(self, cfg: RunConfig, resolved: Mapping[str, Any]) -> float:
        """A worker pushes its (compressed) gradient slices, K (or P) bytes in all."""
        return cfg.compression.wire_bytes(resolved["grad_bytes_logical"])


PS_SYNC = PSSpec(sync=True)
PS_ASYNC = PSSpec(sync=False)
