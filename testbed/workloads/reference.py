"""Single-process training on the concatenated global batch: the trivially correct reference.

Every synchronous strategy must reproduce these parameters step after step (allclose):
worker r's iteration-i batch is the same (worker, iteration) batch the distributed run uses,
the global batch is their concatenation, and one step of the run's optimizer (testbed.training.optim)
uses its mean-loss gradient. Because every worker has the same batch size, that gradient is the
average of the gradients of the batch's N slices, and this is how it is computed here: slice by
slice, averaged in worker order (`mean_gradient`). Batch norm normalises each slice on its own
(testbed.workloads.nets.GhostBatchNorm), as each worker does; `concatenated_gradient` computes
the same gradient in one backward pass over the whole batch, and the unit tests check the two
agree (tests/unit/test_models.py).

Why slice by slice: the two are equal in exact arithmetic, not in float32. A ReLU whose input
sits within rounding of zero turns that last-bit difference into a different gradient for a
whole sample (measured: 1.5e-3 after five steps of a 5k-parameter ResNet), so the reference
sums as the parameter server and the MapReduce driver do, and they match it to the bit.

A torch model computes here at one intra-op thread, as every worker does at its default CPU share
(testbed.runtime.worker.limit_threads): another thread count sums a convolution in another
order, and Adam, which divides by sqrt(v), turns the last-bit difference of a gradient near zero
into a difference of a whole step (measured: 6e-4 after two steps of a ResNet at 2 threads, 5e-7
at 1).

With emulated peers (--real-workers K < N) worker x's slice is its real owner's
(testbed.emulation.peers): the mean gradient weighs each real worker by the workers it stands for.

The synthetic workload's `--compute-ms` is time, not arithmetic: the reference skips it (a
30-step run of 3 workers at 100 ms would otherwise sleep 9 s here for the same parameters).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from testbed.config import RunConfig
from testbed.emulation.peers import owner
from testbed.training.optim import Optimizer, mean_gradient, optimizer_for
from testbed.workloads import Workload, make_workload


def reference_training(cfg: RunConfig, steps: int | None = None, device: str = "cpu") -> np.ndarray:
    """Flat parameters after `steps` (default cfg.steps) single-process steps of cfg's optimizer,
    the gradients computed on `device` (a GPU run is compared with the same GPU's arithmetic)."""
    with _one_thread(cfg.workload.imports_torch(device)):
        model = make_workload(replace(cfg.workload, compute_ms=0.0), seed=cfg.seed, workers=cfg.workers,
                              device=device)
        optimizer = Optimizer(optimizer_for(cfg.workload))
        params = model.get_params()
        # worker x's gradient: its own, or, for an emulated peer, its real owner's (emulation.peers)
        sources = {x: owner(cfg.workers, cfg.real_workers, x) for x in range(cfg.workers)}
        for i in range(cfg.steps if steps is None else steps):
            model.set_params(params)
            real = {q: np.asarray(model.gradient(model.batch(q, i))[0], dtype=np.float32)
                    for q in sorted(set(sources.values()))}
            optimizer.step(params, mean_gradient([real[sources[x]] for x in range(cfg.workers)]))
    return params


def concatenated_gradient(model: Workload, workers: int, iteration: int) -> np.ndarray:
    """The gradient of the global batch of `iteration` in one backward pass (see the docstring)."""
    return model.gradient(model.combine([model.batch(r, iteration) for r in range(workers)]))[0]


@contextlib.contextmanager
def _one_thread(torch_model: bool) -> Iterator[None]:
    if not torch_model:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
