"""The one explicit table of strategies: name -> Strategy class. argparse choices come from it."""

from __future__ import annotations

from testbed.allreduce.strategy import RingAllreduce, TorchAllreduce
from testbed.gossip.strategy import GossipSGD
from testbed.mapreduce.driver import MapReduce
from testbed.ps.asynchronous import PSAsync
from testbed.ps.sync import PSSync
from testbed.strategy import Strategy

STRATEGIES: dict[str, type[Strategy]] = {
    MapReduce.name: MapReduce,
    RingAllreduce.name: RingAllreduce,
    TorchAllreduce.name: TorchAllreduce,
    PSSync.name: PSSync,
    PSAsync.name: PSAsync,
    GossipSGD.name: GossipSGD,
}


def families() -> dict[str, str]:
    """name -> family, for config validation (which flags apply to which strategy)."""
    return {name: cls.family for name, cls in STRATEGIES.items()}
