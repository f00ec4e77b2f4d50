"""The real architectures and their data: batch-norm rule, gradients, evaluation, learnability."""

import numpy as np
import pytest
import torch

from testbed.config import RunConfig, with_overrides
from testbed.training.optim import mean_gradient
from testbed.workloads import make_workload
from testbed.workloads.nets import GhostBatchNorm
from testbed.workloads.reference import concatenated_gradient

RESNET = {"workload.name": "resnet", "workload.width": 4, "workload.batch_size": 8}
LM = {"workload.name": "transformer", "workload.d_model": 16, "workload.layers": 1, "workload.heads": 2,
      "workload.seq_len": 16, "workload.vocab": 16, "workload.batch_size": 4}


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def workload(extra, workers=3):
    cfg = with_overrides(RunConfig(workers=workers), **extra)
    return cfg, make_workload(cfg.workload, seed=1, workers=workers)


@pytest.mark.parametrize("extra", [RESNET, LM, {"workload.name": "mlp"}], ids=["resnet", "transformer", "mlp"])
def test_the_global_batch_gradient_is_the_average_of_the_workers(extra):
    """The equivalence the synchronous strategies rest on: one backward over the concatenated
    batch (batch norm per worker slice) equals the average of the workers' gradients."""
    cfg, w = workload(extra)
    whole = concatenated_gradient(w, cfg.workers, 0)
    parts = mean_gradient([w.gradient(w.batch(r, 0))[0] for r in range(cfg.workers)])
    np.testing.assert_allclose(whole, parts, rtol=1e-4, atol=1e-6)
    assert np.abs(whole).max() > 1e-3


def test_plain_batch_norm_over_the_global_batch_would_break_it():
    """The check can fail: normalising the whole global batch at once gives another gradient."""
    cfg, w = workload(RESNET)
    parts = mean_gradient([w.gradient(w.batch(r, 0))[0] for r in range(cfg.workers)])
    for m in w.model.modules():
        if isinstance(m, GhostBatchNorm):
            m.group = None
    whole = concatenated_gradient(w, cfg.workers, 0)
    assert not np.allclose(whole, parts, rtol=1e-4, atol=1e-6)


def test_ghost_batch_norm_normalises_each_group_with_its_own_statistics():
    bn = GhostBatchNorm(3, group=4)
    x = torch.randn(8, 3, 5, 5) * 3 + 1
    y = bn(x)
    for g in (y[:4], y[4:]):
        assert torch.allclose(g.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5)
        assert torch.allclose(g.var(dim=(0, 2, 3), unbiased=False), torch.ones(3), atol=1e-3)
    bn.eval()
    with pytest.raises(RuntimeError, match="calibrate"):
        bn(x)


def test_evaluation_recalibrates_batch_norm_for_the_parameters_given():
    """Two parameter vectors evaluated in turn: each with its own statistics, reproducibly."""
    cfg, w = workload(RESNET)
    p0 = w.get_params()
    p1 = p0 + np.random.default_rng(0).normal(scale=0.05, size=p0.shape).astype(np.float32)
    a, b, a2 = w.evaluate(p0, 64), w.evaluate(p1, 64), w.evaluate(p0, 64)
    assert a == a2 and a != b
    assert 0.0 <= a["acc"] <= 1.0 and a["loss"] > 0


@pytest.mark.parametrize("extra", [RESNET, LM], ids=["resnet", "transformer"])
def test_a_few_steps_lower_the_held_out_loss(extra):
    from testbed.training.optim import Optimizer, optimizer_for

    cfg = with_overrides(RunConfig(workers=1), **{**extra, "workload.optimizer": "adam", "workload.lr": 0.01,
                                                  "workload.batch_size": 32})
    w = make_workload(cfg.workload, seed=0, workers=1)
    opt = Optimizer(optimizer_for(cfg.workload))
    before = w.evaluate(w.get_params(), 128)["loss"]
    for i in range(25):
        w.apply_update(w.gradient(w.batch(0, i))[0], opt)
    after = w.evaluate(w.get_params(), 128)["loss"]
    assert after < 0.97 * before, (before, after)  # deterministic: 1.437 -> 1.296, 2.776 -> 2.668


def test_the_language_model_is_tied_and_causal():
    cfg, w = workload(LM, workers=1)
    names = [n for n, _ in w.layout]
    assert "wte.weight" in names and not any("lm_head" in n for n in names)  # the output is the embedding
    x = torch.randint(0, 16, (2, 16))
    out = w.model(x)
    x2 = x.clone()
    x2[:, 10:] = (x2[:, 10:] + 1) % 16  # change the future: the past's predictions stay
    assert torch.allclose(out[:, :10], w.model(x2)[:, :10], atol=1e-6)
