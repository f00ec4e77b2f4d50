"""Parameter-server invariants on a real Ray run: staleness, SSP, backup workers, apply-once."""

import numpy as np
import pytest
import ray

from testbed.ps.server import ShardActor
from testbed.ps.ssp import ssp_staleness_bound
from testbed.training.optim import OptimizerSpec
from tests.ray.helpers import make_config, run_strategy

SLOW = "fixed:worker=0,delay=60ms"


@pytest.fixture(scope="module")
def async_slow():
    # the MLP's 2,372 parameters in 3 partitions, each applied and pulled back on its own
    cfg = make_config(strategy="ps-async", workers=3, steps=40, straggler=SLOW,
                      **{"workload.lr": 0.05, "ps.partition_mb": 0.003})
    return run_strategy(cfg)


@pytest.fixture(scope="module")
def ssp_slow():
    cfg = make_config(strategy="ps-async", workers=3, steps=40, straggler=SLOW,
                      **{"workload.lr": 0.05, "ps.staleness_bound": 2})
    return run_strategy(cfg)


def test_async_staleness_nonnegative_and_slow_worker_is_stalest(async_slow):
    steps = async_slow["steps"]
    applied = steps[steps["version_applied"].notna()]
    assert (applied["staleness"] >= 0).all()
    assert (applied["staleness"] == applied["version_applied"] - applied["version_read"]).all()
    by_worker = applied.groupby("worker")["staleness"].mean()
    assert by_worker[0] > 0
    assert by_worker[0] > by_worker.drop(0).max()


def test_async_starts_no_iteration_beyond_the_steps(async_slow):
    """The driver starts an iteration only while the updates recorded plus those in flight are
    fewer than --steps: 40 updates are 40 iterations, every one applied, none refused."""
    steps = async_slow["steps"]
    assert len(steps) == 40 and steps["version_applied"].notna().all()


def test_async_versions_strictly_increase_and_loss_decreases(async_slow):
    upd = async_slow["updates"]
    assert list(upd["version"]) == list(range(1, 41))
    assert np.all(np.diff(upd["t_applied"].to_numpy()) >= 0)
    assert upd["loss"].iloc[-8:].mean() < upd["loss"].iloc[:8].mean()


def test_async_fast_workers_keep_going(async_slow):
    """Each fast worker keeps its own pace beside the 60 ms straggler: its median interval between
    steps is shorter than the straggler's by at least half the injected delay (a worker held back
    steps with the straggler). On a busy machine both intervals grow alike, so the comparison stays
    on the straggler's own scale; step counts did not (beside a CPU hog one fast worker made 10
    steps to the straggler's 6)."""
    steps = async_slow["steps"].sort_values("t_start")
    interval = steps.groupby("worker")["t_start"].apply(lambda t: float(np.median(np.diff(t.to_numpy()))))
    counts = steps.groupby("worker").size()
    for w in (1, 2):
        assert interval[0] - interval[w] > 0.03 and counts[w] > counts[0], (interval, counts)


def test_ssp_bound_holds_and_fast_workers_wait(ssp_slow, async_slow):
    steps = ssp_slow["steps"]
    applied = steps[steps["version_applied"].notna()]
    assert applied["staleness"].max() <= ssp_staleness_bound(3, 2)
    # iteration gap: nobody runs more than s+1 iterations ahead of the slowest
    for _, row in steps.iterrows():
        slowest_done = (steps[(steps["worker"] == 0) & (steps["t_start"] < row["t_start"])]).shape[0]
        assert row["iteration"] <= slowest_done + 2
    fast_wait = steps[steps["worker"] != 0]["wait_s"].sum()
    free_wait = async_slow["steps"].query("worker != 0")["wait_s"].sum()
    assert fast_wait > 0.05 and fast_wait > 5 * free_wait


def test_backup_worker_drops_exactly_one_gradient_per_version():
    cfg = make_config(strategy="ps-sync", workers=4, steps=6, straggler="fixed:worker=3,delay=80ms",
                      **{"ps.backup_workers": 1})
    out = run_strategy(cfg)
    upd = out["updates"]
    assert (upd["contributors"] == 3).all() and (upd["dropped"] == 1).all()
    steps = out["steps"]
    late = steps[(steps["worker"] == 3) & steps["version_applied"].isna()]
    assert len(late) >= 1
    applied = steps[steps["version_applied"].notna()]
    assert applied.groupby("version_applied").size().eq(3).all()


def test_retried_push_is_not_applied_twice():
    cfg = make_config(strategy="ps-async", workers=1)
    shard = ray.remote(ShardActor).options(num_cpus=0.1, max_concurrency=4).remote(
        {0: 4}, cfg.network, 1.0, rank=0, optimizer=OptimizerSpec(lr=1.0), sync=False, workers=1)
    g = np.ones(4, np.float32)
    first = ray.get(shard.push.remote(0, g, 0, 0, 0, 1.0, None), timeout=30)
    again = ray.get(shard.push.remote(0, g, 0, 0, 0, 1.0, None), timeout=30)
    assert (first["status"], again["status"]) == ("applied", "duplicate")
    np.testing.assert_array_equal(ray.get(shard.get_params.remote(), timeout=30)[0], -g)
    ray.kill(shard)


def test_emulated_peers_push_through_the_servers_nics_and_a_straggling_one_holds_a_version_back():
    """ps-sync, 8 workers of which 0 and 4 are real: the servers' NICs carry the bytes of all
    eight every version (the incast is emulated peers' too), records name the real positions,
    samples count every worker, and emulated worker 5's 300 ms straggle holds every version back
    (a bound: never shorter), as a real straggler's would."""
    base = {"strategy": "ps-sync", "workers": 8, "steps": 3, "network.bandwidth": "10Gbit",
            "workload.compute_ms": 10.0, "ps.shards": 2, "cluster.real_workers": 2}
    out = run_strategy(make_config(**base, straggler="fixed:worker=5,delay=300ms"))
    steps, s = out["steps"], out["summary"]
    assert sorted(steps["worker"].unique()) == [0, 4] and s["real_workers"] == 2
    k = s["grad_bytes_logical"]
    np.testing.assert_allclose(sum(s["server_ingress_bytes_per_step"]), 8 * k, rtol=1e-6)
    # out: the first pull, then every version's replies
    np.testing.assert_allclose(sum(s["server_egress_bytes_per_step"]), 8 * k * 4 / 3, rtol=1e-6)
    np.testing.assert_allclose(steps["bytes_sent"], k, rtol=1e-6)  # each real worker: its own push
    per_step = steps.groupby("iteration")["samples"].sum()
    np.testing.assert_allclose(s["samples_per_s"], 8 * steps["samples"].iloc[0] * len(per_step) / s["train_wall_s"],
                               rtol=1e-9)
    assert s["step_time_p50_s"] >= 0.3
    assert (steps["injected_delay_s"] == 0).all()  # neither real worker straggled


def test_async_emulated_peers_run_iterations_of_their_own():
    """ps-async, 8 workers of which 0 and 4 are real (testbed.ps.async_peers): every position has
    rows of its own, the peers' marked `emulated`; the driver's rule counts them as workers (12
    updates are 12 iterations, every one applied, the first 8 begun together); each push crossed
    the servers' NICs both ways; samples count each row once; and emulated worker 5's 300 ms delay
    is its own rows' alone."""
    base = {"strategy": "ps-async", "workers": 8, "steps": 12, "network.bandwidth": "10Gbit",
            "workload.compute_ms": 10.0, "ps.shards": 2, "ps.partition_mb": 0.004, "cluster.real_workers": 2}
    out = run_strategy(make_config(**base, straggler="fixed:worker=5,delay=300ms"))
    steps, s = out["steps"], out["summary"]
    assert s["real_workers"] == 2 and s["ps_partitions"] == 3
    assert sorted(steps["worker"].unique()) == list(range(8))
    assert (steps["emulated"] == ~steps["worker"].isin([0, 4])).all()
    assert len(steps) == 12 and steps["version_applied"].notna().all()
    assert list(out["updates"]["version"]) == list(range(1, 13))
    assert (steps["staleness"] >= 0).all() and (steps.loc[steps["iteration"] == 0, "version_read"] == 0).all()
    k = s["grad_bytes_logical"]
    np.testing.assert_allclose(sum(s["server_ingress_bytes_per_step"]), k, rtol=1e-6)  # 12 pushes, 12 updates
    np.testing.assert_allclose(sum(s["server_egress_bytes_per_step"]), k, rtol=1e-6)  # a reply each
    np.testing.assert_allclose(s["samples_per_s"], steps["samples"].sum() / s["train_wall_s"], rtol=1e-9)
    delayed = steps["worker"] == 5
    np.testing.assert_allclose(steps.loc[delayed, "injected_delay_s"], 0.3, rtol=1e-9)
    assert (steps.loc[~delayed, "injected_delay_s"] == 0).all()
    assert (steps.loc[steps["emulated"], "compute_s"] == 0.01).all()  # the configured compute, not measured


def test_an_async_emulated_peer_applies_its_owners_gradient():
    """Two workers, worker 1 emulated, two updates on two servers: both first iterations compute on
    version 0, and the peer's push is its owner's gradient, so every partition ends at version 0
    stepped twice by worker 0's iteration-0 gradient (the order of the two cannot matter)."""
    from dataclasses import replace

    from testbed.training.optim import Optimizer, optimizer_for
    from testbed.workloads import make_workload

    cfg = make_config(strategy="ps-async", workers=2, steps=2, **{"network.bandwidth": "10Gbit", "ps.shards": 2,
                                                                  "ps.partition_mb": 0.004, "cluster.real_workers": 1})
    out = run_strategy(cfg)
    model = make_workload(replace(cfg.workload, compute_ms=0.0), seed=cfg.seed, workers=cfg.workers)
    params, opt = model.get_params(), Optimizer(optimizer_for(cfg.workload))
    g0 = np.asarray(model.gradient(model.batch(0, 0))[0], dtype=np.float32)
    opt.step(params, g0)
    opt.step(params, g0)
    np.testing.assert_allclose(out["flat"], params, rtol=1e-6, atol=1e-7)
    rows = out["steps"].sort_values("worker")
    assert list(rows["worker"]) == [0, 1] and list(rows["emulated"]) == [False, True]
