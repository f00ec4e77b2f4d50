"""What is true of `mapreduce`: synchronous SGD where the driver broadcasts, workers compute
their gradients (map) and the driver averages and applies them (reduce). Every byte crosses the
driver's NIC: per step it sends K to each of N workers and receives N gradients, so the step
grows linearly with N (`driver.py` has the schedule). Pure: no Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from testbed.analysis import costmodel
from testbed.config import RunConfig
from testbed.strategies.contract import Equivalence, Prediction, Strategy, StrategySpec
from testbed.workloads import tiny


class MapReduceSpec(StrategySpec):
    name = "mapreduce"
    family = "mapreduce"
    # runs equal to one-process training (tests/ray/test_equivalence.py): the ResNet with SGD where
    # the driver applies the mean; ranks 0-2 sharing a process, 3 alone; emulated peers (weights 3
    # and 2, then one real worker standing for three)
    equivalence = (Equivalence(2, tiny.RESNET_SGD),
                   Equivalence(4, {**tiny.SYN, "cluster.workers_per_process": 3}),
                   Equivalence(5, {**tiny.SYN, "network.bandwidth": "10Gbit", "cluster.real_workers": 2}),
                   Equivalence(3, {**tiny.SYN, "network.bandwidth": "10Gbit", "cluster.real_workers": 1}))
    keys = frozenset({"compression"})
    summary_keys = {
        "grad_bytes_logical": "bytes: the logical gradient K",
        "driver_bytes_per_step": "bytes: what crosses the driver's NIC per step (N K out + N P in)",
    }

    def shell(self) -> type[Strategy]:
        from testbed.mapreduce.driver import MapReduce  # the Ray shell, imported when a run starts
        return MapReduce

    def cannot_share_processes(self, cfg: RunConfig) -> str | None:
        return None  # the driver calls each worker

    def cannot_emulate_peers(self, cfg: RunConfig) -> str | None:
        """The driver sends every position its parameters and queues every position's gradient;
        a real worker plays its peers' NICs (driver.py). A compressed gradient is each worker's
        own (its top-k residual), so peers play uncompressed runs only."""
        if cfg.compression.kind != "none":
            return f"plays emulated peers uncompressed (got --compression {cfg.compression.kind})"
        return None

    def predict(self, cfg: RunConfig, resolved: Mapping[str, Any], latency: float,
                bandwidth: float) -> Prediction:
        n, k = cfg.workers, resolved["grad_bytes_logical"]
        push = cfg.compression.wire_bytes(k)
        comm = costmodel.mapreduce_pipelined_comm_s(n, k, latency, bandwidth, push=push)
        upper = costmodel.mapreduce_comm_s(n, k, latency, bandwidth, push=push)
        formula = "2*a + (N+1)*K/B (pipelined)" if push == k else "2*a + N*K/B + P/B (pipelined, P compressed)"
        return Prediction(comm, formula, upper)

    def bytes_per_worker(self, cfg: RunConfig, resolved: Mapping[str, Any]) -> float:
        return cfg.compression.wire_bytes(resolved["grad_bytes_logical"])


MAPREDUCE = MapReduceSpec()
