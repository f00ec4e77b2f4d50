"""The optimizers against torch.optim (the trivially correct reference), on numpy and on torch."""

import numpy as np
import pytest
import torch

from testbed.training.optim import Optimizer, OptimizerSpec, to_numpy_state

CASES = [
    OptimizerSpec("sgd", lr=0.1),
    OptimizerSpec("sgd", lr=0.05, weight_decay=0.01),
    OptimizerSpec("momentum", lr=0.1, momentum=0.9),
    OptimizerSpec("momentum", lr=0.02, momentum=0.5, weight_decay=1e-3),
    OptimizerSpec("adam", lr=1e-3),
    OptimizerSpec("adam", lr=3e-3, weight_decay=0.1),
]


def _torch_reference(spec, p0, grads):
    p = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    if spec.kind == "adam":
        opt = torch.optim.Adam([p], lr=spec.lr, weight_decay=spec.weight_decay)
    else:
        opt = torch.optim.SGD([p], lr=spec.lr, momentum=spec.momentum if spec.kind == "momentum" else 0.0,
                              weight_decay=spec.weight_decay)
    for g in grads:
        p.grad = torch.from_numpy(g.copy())
        opt.step()
    return p.detach().numpy()


@pytest.mark.parametrize("spec", CASES, ids=lambda s: f"{s.kind}-wd{s.weight_decay}")
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_matches_torch_optim(spec, kind):
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal(257).astype(np.float32)
    grads = [rng.standard_normal(257).astype(np.float32) for _ in range(6)]
    params = p0.copy() if kind == "numpy" else torch.from_numpy(p0.copy())
    opt = Optimizer(spec)
    for g in grads:
        opt.step(params, g.copy() if kind == "numpy" else torch.from_numpy(g.copy()))
    got = params if kind == "numpy" else params.numpy()
    np.testing.assert_allclose(got, _torch_reference(spec, p0, grads), rtol=1e-5, atol=1e-6)
    assert not np.allclose(got, p0)


@pytest.mark.parametrize("spec", CASES[2:], ids=lambda s: s.kind)
def test_slices_with_their_own_state_equal_the_whole(spec):
    """What a partitioned parameter server relies on: every rule is elementwise."""
    rng = np.random.default_rng(1)
    whole = rng.standard_normal(100).astype(np.float32)
    parts = [whole[:37].copy(), whole[37:].copy()]
    opt, opts = Optimizer(spec), [Optimizer(spec), Optimizer(spec)]
    for _ in range(4):
        g = rng.standard_normal(100).astype(np.float32)
        opt.step(whole, g)
        opts[0].step(parts[0], g[:37])
        opts[1].step(parts[1], g[37:])
    np.testing.assert_array_equal(np.concatenate(parts), whole)


@pytest.mark.parametrize("spec", CASES[2:], ids=lambda s: s.kind)
def test_state_round_trips_between_numpy_and_torch(spec):
    """A rollback or a restarted replica continues exactly where the state was taken."""
    rng = np.random.default_rng(2)
    grads = [rng.standard_normal(50).astype(np.float32) for _ in range(5)]
    a = np.zeros(50, np.float32)
    opt = Optimizer(spec)
    for g in grads[:3]:
        opt.step(a, g)
    saved, params = to_numpy_state(opt.state_dict()), a.copy()
    for g in grads[3:]:
        opt.step(a, g)
    b = torch.from_numpy(params)
    resumed = Optimizer(spec)
    resumed.load_state_dict(saved, like=b)
    for g in grads[3:]:
        resumed.step(b, torch.from_numpy(g))
    np.testing.assert_allclose(b.numpy(), a, rtol=1e-6, atol=1e-7)
    assert resumed.t == 5


def test_unknown_optimizer_is_refused():
    with pytest.raises(ValueError, match="choose one of sgd, momentum, adam"):
        OptimizerSpec("lamb")
