"""The numpy mlp and logreg (testbed.workloads.dense) against the same networks in torch autograd."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from testbed.config import RunConfig, with_overrides
from testbed.workloads import make_workload
from testbed.workloads.dense import DenseWorkload
from testbed.workloads.models import TorchWorkload

CASES = [{"workload.name": "mlp"}, {"workload.name": "logreg"},
         {"workload.name": "mlp", "workload.hidden": 7, "workload.features": 5, "workload.classes": 3}]
IDS = ["mlp", "logreg", "mlp-odd-shapes"]


def pair(extra, workers=2):
    cfg = with_overrides(RunConfig(workers=workers), **extra).workload
    dense = make_workload(cfg, seed=4, workers=workers)
    ref = TorchWorkload(cfg, seed=4, workers=workers)
    ref.set_params(dense.get_params())
    return dense, ref


@pytest.mark.parametrize("extra", CASES, ids=IDS)
def test_layout_loss_gradient_and_evaluation_equal_torch_autograd(extra):
    torch.set_num_threads(1)
    dense, ref = pair(extra)
    assert isinstance(dense, DenseWorkload)
    assert dense.layout == ref.layout and dense.numel == ref.numel
    for it in range(3):  # a few batches, and a few SGD steps between them
        batch = dense.batch(1, it)
        np.testing.assert_array_equal(batch, ref.batch(1, it))
        g, loss, n = dense.gradient(batch)
        g_ref, loss_ref, n_ref = ref.gradient(batch)
        assert n == n_ref and loss == pytest.approx(loss_ref, rel=1e-5)
        np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-6)
        assert np.abs(g).max() > 1e-3
        params = dense.get_params() - 0.5 * g
        dense.set_params(params)
        ref.set_params(params)
    flat = dense.get_params()
    ours, theirs = dense.evaluate(flat, 300), ref.evaluate(flat, 300)
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5) and ours["acc"] == theirs["acc"]


@pytest.mark.parametrize("extra", CASES[:2], ids=IDS[:2])
def test_buckets_are_handed_out_once_last_layer_first_and_hold_the_gradient(extra):
    dense, _ = pair(extra)
    batch = dense.batch(0, 0)
    whole = dense.gradient(batch)[0]
    buckets = [[i, i + 1] for i in range(0, len(dense.layout), 2)]  # a bucket per layer
    seen = []
    grad, _, _ = dense.gradient_buckets(batch, buckets, lambda b, view: seen.append((b, view.copy())))
    assert [b for b, _ in seen] == list(reversed(range(len(buckets))))
    for b, view in seen:
        np.testing.assert_array_equal(view, whole[dense.bucket_slice(buckets[b])])
    np.testing.assert_array_equal(grad, whole)


def test_initialisation_is_torch_linear_s_and_the_same_for_every_replica():
    cfg = RunConfig().workload
    a, b = (make_workload(cfg, seed=4, workers=2) for _ in range(2))
    other = make_workload(cfg, seed=5, workers=2)
    np.testing.assert_array_equal(a.get_params(), b.get_params())
    assert not np.array_equal(a.get_params(), other.get_params())
    for (_, shape), sl in zip(a.layout, a.slices(), strict=True):
        fan_in = a.layout[0][1][1] if sl.start < a.slices()[2].start else a.layout[2][1][1]
        w = a.get_params()[sl]
        bound = 1 / np.sqrt(fan_in)
        assert np.abs(w).max() <= bound and np.abs(w).max() > 0.8 * bound, shape  # uniform in +-bound


def test_which_workloads_import_torch():
    w = RunConfig().workload
    assert not w.imports_torch("cpu") and w.imports_torch("cuda")
    assert with_overrides(RunConfig(), **{"workload.name": "resnet"}).workload.imports_torch("cpu")
    assert not with_overrides(RunConfig(), **{"workload.name": "synthetic"}).workload.imports_torch("cuda")


def test_an_mlp_worker_never_imports_torch():
    code = ("import sys; from testbed.config import RunConfig; from testbed.workloads import make_workload; "
            "w = make_workload(RunConfig().workload, seed=0, workers=2); w.gradient(w.batch(0, 0)); "
            "w.evaluate(w.get_params(), 64); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
