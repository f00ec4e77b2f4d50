"""Single-process SGD on the concatenated global batch: the trivially correct reference.

Every synchronous strategy must reproduce these parameters step after step (allclose):
worker r's iteration-i batch is the same (worker, iteration) batch the distributed run uses,
the global batch is their concatenation, and one SGD step uses its mean-loss gradient — which
equals the average of the workers' gradients because every worker has the same batch size.
"""

from __future__ import annotations

import numpy as np

from testbed.config import RunConfig
from testbed.workloads import make_workload


def reference_sgd(cfg: RunConfig, steps: int | None = None) -> np.ndarray:
    """Flat parameters after `steps` (default cfg.steps) single-process SGD steps."""
    model = make_workload(cfg.workload, seed=cfg.seed, workers=cfg.workers)
    params = model.get_params()
    for i in range(cfg.steps if steps is None else steps):
        model.set_params(params)
        batch = model.combine([model.batch(r, i) for r in range(cfg.workers)])
        grad, _, _ = model.gradient(batch)
        params = params - np.float32(cfg.workload.lr) * grad
    return params
