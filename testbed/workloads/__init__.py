"""Workloads: what each worker computes. Real models (mlp and logreg in numpy on the CPU, torch
for the ResNet, the transformer and anything on a GPU) and a torch-free synthetic gradient.

`make_workload` imports torch only for the models that need it (`WorkloadConfig.imports_torch`),
so most workers stay light.
"""

from __future__ import annotations

from dataclasses import replace

from testbed.config import Payload, WorkloadConfig
from testbed.workloads.base import Workload


def make_workload(cfg: WorkloadConfig, *, seed: int, workers: int, device: str = "cpu") -> Workload:
    """Build the workload replica for one process (all replicas start identical)."""
    if not cfg.real_compute:  # plain, or shaped as a real model (profile:NAME)
        from testbed.workloads.synthetic import SyntheticWorkload

        return SyntheticWorkload(cfg, seed=seed, workers=workers)
    if not cfg.imports_torch(device):
        from testbed.workloads.dense import DenseWorkload

        return DenseWorkload(cfg, seed=seed, workers=workers)
    from testbed.workloads.models import TorchWorkload

    return TorchWorkload(cfg, seed=seed, workers=workers, device=device)


def tensor_plan(cfg: WorkloadConfig, *, seed: int) -> tuple[list[int], list[float] | None]:
    """The workload's logical tensor sizes and backward shares, from the workload a run builds
    (its smallest payload: the sizes are logical, the arrays one element per tensor): what a
    spec's `plan` needs to predict a run before it starts (the map, --dilation auto)."""
    work = make_workload(replace(cfg, payload=Payload(1e-12)), seed=seed, workers=1)
    return work.logical_sizes(), getattr(work, "backward_share", None)


__all__ = ["Workload", "make_workload", "tensor_plan"]
