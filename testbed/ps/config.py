"""The parameter server's config section (`cfg.ps`, flags --ps-shards, --staleness-bound, ...).

Owned here and named by the spec (`PSSpec.sections`); the registry hands it to the config, which
builds every RunConfig with it (testbed.config.schema, "strategy sections"). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.config.checks import choice, integer, real
from testbed.config.fields import opt

PS_PLACEMENTS = ("dedicated", "colocated")


@dataclass(frozen=True)
class PSConfig:
    """parameter server"""

    shards: int = opt(1, flag="--ps-shards", check=integer(1, 1024, "use an integer number of server shards >= 1"),
                      help="parameter-server shards, balanced by bytes")
    staleness_bound: int | None = opt(None, check=integer(0, None, "use an integer >= 0 (0 = bulk synchronous)"),
                                      help="stale-synchronous parallel: clock bound s (default: none)")
    backup_workers: int = opt(0, check=integer(0, None, "use an integer >= 0"),
                              help="apply after the first N-b gradients of a step, drop the rest")
    servers: int | None = opt(None, flag="--ps-servers", check=integer(1, 1024, "use an integer number of servers >= 1"),
                              help="the k of 'n workers + k servers': the same count as --ps-shards")
    placement: str = opt("dedicated", flag="--ps-placement", check=choice(PS_PLACEMENTS),
                         help="dedicated: each server its own machine and NIC; colocated: server i "
                              "shares worker i's machine and NIC")
    partition_mb: float = opt(4.0, flag="--ps-partition-mb", check=real(0, None, fix="use a size in MiB >= 0 (0: off), e.g. 4"),
                              help="push, average and pull the gradient in partitions of at most this "
                                   "many MiB, so pulls overlap pushes (0: one per server)")

    @property
    def count(self) -> int:
        """Server actors: --ps-servers where given, else --ps-shards (validate refuses a conflict)."""
        return self.shards if self.servers is None else self.servers
