"""Gossip's config section (`cfg.gossip`, flags --topology, --gossip-async).

Owned here and named by the spec (`GossipSpec.sections`); the registry hands it to the config,
which builds every RunConfig with it (testbed.config.schema, "strategy sections"). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.config.fields import opt


@dataclass(frozen=True)
class GossipConfig:
    """decentralised (gossip)"""

    topology: str = opt("ring", help="neighbour graph")
    asynchronous: bool = opt(False, flag="--gossip-async", action="store_true",
                             help="pairwise asynchronous averaging instead of rounds")
