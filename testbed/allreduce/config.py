"""The allreduce family's config section (`cfg.ring`, flags --bucket-mb, --overlap, --algorithm,
...), read by `ring` and `allreduce-torch`.

Owned here and named by the spec (`AllreduceSpec.sections`); the registry hands it to the
config, which builds every RunConfig with it (testbed.config.schema, "strategy sections"). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.config.checks import integer, real
from testbed.config.environment import MAX_WORKERS
from testbed.config.fields import opt


@dataclass(frozen=True)
class RingConfig:
    """allreduce"""

    bucket_mb: float = opt(25.0, check=real(0, None, low_ok=False, fix="use a bucket size in MiB > 0, e.g. 25"),
                           help="gradient bucket size (MiB)")
    first_bucket_mb: float = opt(1.0, check=real(0, None, low_ok=False, fix="use a size in MiB > 0, e.g. 1"),
                                 help="cap of the first bucket (last layers), as DDP's 1 MiB")
    overlap: bool = opt(True, action="optional", help="allreduce buckets while backward runs")
    transport: str = opt("object-store", help="object-store (Ray shared-memory channels) or torch (gloo/NCCL p2p)")
    algorithm: str = opt("ring", help="how a bucket is summed")
    node_size: int | None = opt(None, check=integer(1, MAX_WORKERS, "use an integer number of workers per node >= 1"),
                                help="hierarchical: workers per emulated node (default: one node per Ray node)")
