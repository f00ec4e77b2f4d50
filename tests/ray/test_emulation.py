"""Emulated network and stragglers: shards against the cost model, injected delays.

The scaling curves of mapreduce, ring and ps-sync against the model (per point and as ratios)
are tests/ray/test_regression.py's. Tolerances are ratios within one run, widened by what the
run measured leaking past the emulator (`emulation_leak_frac`).
"""

import numpy as np
import pytest

from tests.ray.helpers import make_config, run_strategy

SYN = {"workload.name": "synthetic", "workload.compute_ms": 0.0, "workload.grad_mb": 10.0,
       "workload.payload": "scaled:0.01"}
NET = {**SYN, "network.bandwidth": "1Gbit", "network.latency": "50us"}


def _min_step(out):
    return float(np.diff(out["updates"]["t_applied"]).min())


def test_ps_shards_divide_the_step_time():
    """S = 4 shards cut a step at least by the model's (N+1)/((N+2S-1)/S) = 5/2.75, within what the
    machine can resolve: the same runs on the real network (no emulation) measure the machine's
    own cost per step c, which can add to an emulated step at most, so t1/t4 >= m1/(m4 + c4).

    The pipelined model assumes every shard serves the workers' pulls in the same order, so each
    worker's S pieces queue at its ingress; shards that serve in other orders (pulls reach them
    in any order) spread them out, down to 2a + N K/(S B) + K/B: the upper bound of the ratio."""
    shards = {"ps.shards": 4}
    one = run_strategy(make_config(strategy="ps-sync", workers=4, steps=3, **NET))
    four = run_strategy(make_config(strategy="ps-sync", workers=4, steps=3, **NET, **shards))
    c1 = _min_step(run_strategy(make_config(strategy="ps-sync", workers=4, steps=3, **SYN)))
    c4 = _min_step(run_strategy(make_config(strategy="ps-sync", workers=4, steps=3, **SYN, **shards)))
    m1, m4 = one["summary"]["predicted_step_s"], four["summary"]["predicted_step_s"]
    assert m1 / m4 == pytest.approx(5 / 2.75, rel=1e-3)  # 2a is tiny beside K/B
    k, b, a = 10 * 2**20, 1e9 / 8, 50e-6
    best4 = 2 * a + 4 * k / (4 * b) + k / b
    ratio = _min_step(one) / _min_step(four)
    assert 0.97 * m1 / (m4 + c4) <= ratio <= 1.03 * (m1 + c1) / best4, (ratio, m1, m4, best4, c1, c4)


@pytest.mark.parametrize("strategy", ["ring", "ps-sync"])  # (mapreduce's barrier: test_same_seed...)
def test_fixed_straggler_bounds_every_synchronous_step(strategy):
    d = 0.08
    cfg = make_config(strategy=strategy, workers=3, steps=4, straggler=f"fixed:worker=0,delay={int(d * 1000)}ms",
                      **{"workload.name": "synthetic", "workload.grad_mb": 0.01, "workload.compute_ms": 1.0})
    out = run_strategy(cfg)
    steps = np.diff(np.concatenate([[out["steps"]["t_start"].min()], out["updates"]["t_applied"]]))
    assert (steps >= d * 0.99).all()
    delays = out["steps"].groupby("worker")["injected_delay_s"].sum()
    assert delays[0] == pytest.approx(d * cfg.steps) and delays.drop(0).sum() == 0


def test_async_fast_workers_keep_their_pace_next_to_a_straggler():
    base = {"workload.name": "synthetic", "workload.grad_mb": 0.01, "workload.compute_ms": 20.0}
    free = run_strategy(make_config(strategy="ps-async", workers=3, steps=60, **base))
    slow = run_strategy(make_config(strategy="ps-async", workers=3, steps=60,
                                    straggler="fixed:worker=0,delay=200ms", **base))

    def fast_rate(out):
        s = out["steps"][out["steps"]["worker"] != 0]
        span = (s["t_start"] + s["compute_s"] + s["comm_s"]).max() - s["t_start"].min()
        return len(s) / span

    # not held back; they may even run faster, since the sleeping straggler frees a shared core
    assert fast_rate(slow) >= 0.85 * fast_rate(free)


def test_same_seed_same_injected_delays():
    kw = {"straggler": "random:dist=lognormal,sigma=0.5,scale=2ms;sporadic:p=0.3,delay=5ms",
          "workload.name": "synthetic", "workload.grad_mb": 0.01, "workload.compute_ms": 0.0}
    a = run_strategy(make_config(strategy="mapreduce", workers=2, steps=4, **kw))
    b = run_strategy(make_config(strategy="mapreduce", workers=2, steps=4, **kw))
    c = run_strategy(make_config(strategy="mapreduce", workers=2, steps=4, seed=4, **kw))

    def delays(out):
        return out["steps"].sort_values(["worker", "iteration"])["injected_delay_s"].to_numpy()

    np.testing.assert_array_equal(delays(a), delays(b))
    assert not np.array_equal(delays(a), delays(c))
