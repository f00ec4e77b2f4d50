"""GPU workers: gradients, replicas and reductions live on the GPU; equals single-process SGD on
the same GPU.

Marked `gpu`: skipped with the reason when no CUDA device is present (tests/conftest.py). The
same strategies run with device = cpu everywhere else in the suite, so the code path under
test here differs only in where tensors live and in the NCCL transport. `python -m testbed.bench
gpu` runs this file on a GPU machine, beside its benchmarks (docs/gpu.md).

Several workers share one GPU (a fraction each, `gpus_per_worker` in the summary): their
replicas and adds stay on the device, and bytes between them go through the host (the object
store, the PS shards, the MapReduce driver). NCCL refuses two ranks on one device, so the
torch.distributed paths need a GPU per worker; the test below checks that refusal is real, and
the run refuses such a configuration before Ray starts (tests/unit/test_cluster_plan.py).
"""

import numpy as np
import pytest

from testbed.workloads.reference import reference_training
from tests.ray.helpers import make_config, run_strategy

pytestmark = pytest.mark.gpu

# A real torch model on the GPU (the synthetic workload is numpy on any device). SGD with
# momentum on the workers or servers, as each strategy applies it.
MLP = {"workload.name": "mlp", "workload.optimizer": "sgd", "workload.lr": 0.1, "cluster.device": "cuda"}
CASES = [
    *[("ps-sync", {}, n) for n in (1, 2, 4)],
    *[("mapreduce", {}, n) for n in (1, 2, 4)],
    *[("ring", {"ring.transport": "object-store"}, n) for n in (1, 2, 4)],  # workers share one GPU
    ("ps-sync", {"ps.shards": 2}, 3),                      # two shards, partitions split across them
    ("ring", {"ring.algorithm": "halving-doubling"}, 3),   # any-pair sends over actor calls
]


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _id(strategy: str, extra: dict, n: int) -> str:
    return "-".join([strategy, *(str(v) for v in extra.values()), f"n{n}"])


@pytest.mark.parametrize(("strategy", "extra", "n"), CASES, ids=[_id(*c) for c in CASES])
def test_cuda_sync_strategy_equals_single_process_sgd_on_the_gpu(strategy, extra, n):
    cfg = make_config(strategy=strategy, workers=n, **MLP, **extra)
    out = run_strategy(cfg)
    assert out["summary"]["device"] == "cuda"
    assert out["summary"]["gpus_per_worker"] == pytest.approx(min(1.0, _gpus() / n), abs=1e-3)
    np.testing.assert_allclose(out["flat"], reference_training(cfg, device="cuda"), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("transport", ["object-store", "torch"])
def test_cuda_ring_equals_single_process_sgd_with_a_gpu_per_worker(transport):
    """The torch transport and the library allreduce run NCCL: one GPU per worker."""
    n = min(2, _gpus())
    if n < 2:
        pytest.skip("NCCL between workers needs a GPU per worker; this machine has one "
                    "(the one-GPU case is test_nccl_refuses_two_ranks_on_one_gpu)")
    cfg = make_config(strategy="ring", workers=n, **MLP, **{"ring.transport": transport})
    out = run_strategy(cfg)
    np.testing.assert_allclose(out["flat"], reference_training(cfg, device="cuda"), rtol=1e-4, atol=1e-5)


def test_allreduce_torch_on_one_gpu_equals_single_process_sgd():
    """torch.distributed with NCCL, one rank (the most one GPU holds)."""
    cfg = make_config(strategy="allreduce-torch", workers=1, **MLP)
    out = run_strategy(cfg)
    np.testing.assert_allclose(out["flat"], reference_training(cfg, device="cuda"), rtol=1e-4, atol=1e-5)


def test_resnet_ring_on_a_shared_gpu_equals_single_process_sgd():
    """Convolutions and the batch-norm rule on the GPU; cuDNN's choice of algorithm may differ
    between processes, so the tolerance is float32 rounding over a few steps, not bits."""
    cfg = make_config(strategy="ring", workers=2, **{**MLP, "workload.name": "resnet", "workload.width": 4})
    out = run_strategy(cfg)
    np.testing.assert_allclose(out["flat"], reference_training(cfg, device="cuda"), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("strategy", ["ps-async", "gossip"])
def test_asynchronous_strategies_train_on_a_shared_gpu(strategy):
    """Not equal to SGD by design; on the GPU they must run, train and stay finite."""
    cfg = make_config(strategy=strategy, workers=2, steps=8, **MLP)
    out = run_strategy(cfg)
    assert out["summary"]["device"] == "cuda"
    assert np.isfinite(out["flat"]).all()
    losses = out["steps"]["loss"].to_numpy()
    assert np.isfinite(losses).all() and len(losses) >= 8


def _nccl_rank(rank: int, port: int, result):
    import datetime

    import torch
    import torch.distributed as dist

    try:
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=60))
        x = torch.ones(4, device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        result.put((rank, "ok", float(x[0])))
    except Exception as exc:  # noqa: BLE001 - the refusal is what is tested
        result.put((rank, "error", f"{type(exc).__name__}: {exc}"))


def test_nccl_refuses_two_ranks_on_one_gpu():
    """The reason the run gives for `allreduce-torch` and `--transport torch` on a shared GPU
    (AllreduceSpec.cannot_share_gpu) is NCCL's own: two ranks on one device fail."""
    import multiprocessing as mp
    import socket

    if _gpus() != 1:
        pytest.skip(f"checks the one-GPU case; this machine has {_gpus()} GPUs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    procs = [ctx.Process(target=_nccl_rank, args=(r, port, result)) for r in range(2)]
    for p in procs:
        p.start()
    outcomes = []
    for _ in procs:
        try:
            outcomes.append(result.get(timeout=60))
        except Exception:  # noqa: BLE001 - a rank that never answers is a hang, also a refusal
            outcomes.append((None, "hang", "no answer within 60 s"))
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
    print("NCCL, two ranks on one GPU:", outcomes)
    assert any(kind != "ok" for _, kind, _ in outcomes), outcomes
