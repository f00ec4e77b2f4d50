import os

import pytest


def pytest_collection_modifyitems(config, items):
    """GPU tests skip with a reason when no CUDA device is present."""
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is present on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray per test module: dashboard off, token auth on, explicit CPUs."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, configure_logging=False,
             log_to_driver=False)
    yield
    ray.shutdown()
