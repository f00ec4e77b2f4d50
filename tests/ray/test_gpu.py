"""GPU workers: gradients and ring reductions live on the GPU; equals single-process SGD.

Marked `gpu`: skipped with the reason when no CUDA device is present (tests/conftest.py). The
same strategies run with device = cpu everywhere else in the suite, so the code path under
test here differs only in where tensors live and in the NCCL transport.
"""

import numpy as np
import pytest

from testbed.reference import reference_training
from tests.ray.helpers import make_config, run_strategy

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(("strategy", "extra"), [
    ("ring", {"ring.transport": "object-store"}),   # several workers may share one GPU
    ("ring", {"ring.transport": "torch"}),          # NCCL point-to-point: one GPU per worker
    ("allreduce-torch", {}),
])
def test_cuda_ring_equals_single_process_sgd(strategy, extra):
    import torch

    n = 2 if extra.get("ring.transport") != "torch" else min(2, torch.cuda.device_count())
    if n < 2 and extra.get("ring.transport") == "torch":
        pytest.skip("NCCL point-to-point needs one GPU per worker; this machine has one")
    cfg = make_config(strategy=strategy, workers=n, **{"cluster.device": "cuda"}, **extra)
    out = run_strategy(cfg)
    np.testing.assert_allclose(out["flat"], reference_training(cfg), rtol=1e-4, atol=1e-5)


def test_device_cuda_without_gpu_is_a_config_error_elsewhere():
    """Runs only with a GPU: the plan asks Ray for GPUs and resolves the device to cuda."""
    from testbed.runtime.cluster import plan_resources

    plan = plan_resources(workers=4, servers=0, total_cpus=2, total_gpus=1, total_memory=2**34,
                          device="auto", cpus_per_worker=None, torch_workers=True)
    assert plan.device == "cuda" and plan.gpus_per_worker == pytest.approx(0.25)
