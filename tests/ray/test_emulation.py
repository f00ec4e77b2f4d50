"""Emulated network and stragglers: server placement against the cost model, injected delays.

The scaling curves of mapreduce, ring and ps-sync against the model (per point and as ratios)
are tests/ray/test_regression.py's. Tolerances are ratios within one run, widened by what the
run measured leaking past the emulator (`emulation_leak_frac`).
"""

import math

import numpy as np
import pytest

from tests.ray.helpers import make_config, run_strategy

SYN = {"workload.name": "synthetic", "workload.compute_ms": 0.0, "workload.grad_mb": 10.0,
       "workload.payload": "scaled:0.01"}
NET = {**SYN, "network.bandwidth": "1Gbit", "network.latency": "50us"}


PLACEMENTS = (("one", {}), ("dedicated", {"ps.servers": 4}),
              ("colocated", {"ps.servers": 4, "ps.placement": "colocated"}))


def _placements(dilation: float | None) -> dict:
    """The summaries of the three placements at one dilation (None: on the real network, no
    emulated time at all)."""
    base = {**(NET if dilation else SYN), "ps.partition_mb": 1.0}
    if dilation:
        base["network.dilation"] = dilation
    return {name: run_strategy(make_config(strategy="ps-sync", workers=4, steps=3, **base, **extra))["summary"]
            for name, extra in PLACEMENTS}


def test_server_placement_follows_the_model_and_the_byteps_argument():
    """N = 4 workers, 10 partitions of a 10 MiB gradient at 1 Gbit/s: one dedicated server, four
    dedicated servers (each worker's NIC carries K out and K in, overlapped: the BytePS case) and
    four servers colocated with the workers (their NICs carry the servers' traffic too). Each run
    meets its own prediction (testbed.analysis.psmodel) within 10% plus what the run measured
    leaking past the emulator, and the three keep the model's order: 4 dedicated < 4 colocated
    < 1 dedicated (the measured order where the model's gap is wider than the two runs'
    tolerances: 4 dedicated and 4 colocated are a few percent apart, within what a busy machine
    blurs).

    At --dilation 2 this machine's own cost per message (20 actor calls per worker per step, which
    no delivery is late for) measured ~10% of the emulated step in every suite run, so the three
    start at 4; where a run measures more than half the tolerance above its model plus the own
    cost allowed below, the three run again at the dilation that leaves half (dilating D' / D
    times divides a fixed real cost's share by that). That cost also varies from run to run on a busy machine (the four
    dedicated servers once measured at most +7.5% at D = 4 and then +16% at D = 6), so each
    placement also runs on the real network: its communication there is this machine's own cost
    of the step's calls, measured now, and an emulated step may add at most that divided by the
    dilation (part of it hides inside emulated transfers), as in tests/ray/test_regression.py."""
    own = {name: max(0.0, s["comm_s_per_step"]) for name, s in _placements(None).items()}
    dilation = 4.0
    runs = _placements(dilation)
    excess = max((s["comm_s_per_step"] - own[n] / dilation) / s["predicted_comm_s"] - 1 for n, s in runs.items())
    if excess > 0.05:  # beyond the machine's own cost, which the check below allows anyway
        dilation = min(16.0, math.ceil(dilation * excess / 0.05))
        runs = _placements(dilation)
    for name, s in runs.items():
        assert s["ps_partitions"] == 10 and s["ps_placement"] == ("colocated" if name == "colocated" else "dedicated")
        model, measured = s["predicted_comm_s"], s["comm_s_per_step"]
        high = model * (1.10 + s["emulation_leak_frac"]) + own[name] / dilation
        assert 0.90 * model <= measured <= high, (name, dilation, f"own {own[name]:.4f} s", s)
    order = ("dedicated", "colocated", "one")
    predicted = [runs[n]["predicted_comm_s"] for n in order]
    assert predicted == sorted(predicted), predicted
    checked = []
    for i, a in enumerate(order):
        for b in order[i + 1:]:
            ra, rb = runs[a], runs[b]
            blur = ((0.10 + ra["emulation_leak_frac"]) * ra["predicted_comm_s"]
                    + (0.10 + rb["emulation_leak_frac"]) * rb["predicted_comm_s"])
            if rb["predicted_comm_s"] - ra["predicted_comm_s"] > blur:
                assert ra["comm_s_per_step"] < rb["comm_s_per_step"], (a, b, ra, rb)
                checked.append((a, b))
    assert ("dedicated", "one") in checked, runs  # the BytePS argument's pair is always resolved
    # the busiest NIC: the lone server's, a worker's NIC with its colocated server
    assert runs["one"]["bottleneck_nic"] == "ps0"
    assert runs["colocated"]["bottleneck_nic"].startswith("worker")


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
    """A 200 ms straggler beside two workers whose steps take 20 ms of compute plus their calls:
    the fast ones are not held back. Checked within the one run, on the scale the straggler sets:
    its own median interval between steps, its 200 ms plus the calls every step makes on this
    machine now (a worker held back by it steps at that interval; the fast steps take a few tens
    of ms here, more on a busy machine, and so does the straggler's). The fast workers' median
    interval and their calls stay under half of it, and they step at least twice as often.
    (Comparing their rate with a run without the straggler compared two moments of this virtual
    machine: it once failed at 0.84x with a tenth of the cores taken by the hypervisor; half the
    delay alone as the scale failed at 0.124 s beside two CPU hogs and a benchmark.)"""
    delay = 0.2
    out = run_strategy(make_config(strategy="ps-async", workers=3, steps=60,
                                   straggler=f"fixed:worker=0,delay={int(delay * 1000)}ms",
                                   **{"workload.name": "synthetic", "workload.grad_mb": 0.01,
                                      "workload.compute_ms": 20.0}))
    steps = out["steps"].sort_values("t_start")
    count = steps.groupby("worker").size()
    slow = float(np.median(np.diff(steps[steps["worker"] == 0]["t_start"].to_numpy())))
    assert slow >= delay
    fast = steps[steps["worker"] != 0]
    for worker, own in fast.groupby("worker"):
        interval = float(np.median(np.diff(own["t_start"].to_numpy())))
        assert interval < slow / 2, (worker, interval, slow)
        assert own["comm_s"].median() < slow / 2, (worker, own["comm_s"].median(), slow)
        assert count[worker] >= 2 * count[0], count.to_dict()


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


def test_mapreduce_emulated_peers_queue_at_the_driver_and_a_straggling_one_holds_the_step_back():
    """mapreduce, 8 workers of which 0 and 4 are real: every step moves eight parameter copies out
    of the driver's NIC and eight gradients in, so it lasts at least (N + 1) K / B (a bound that
    holds however busy the machine is; with only the real workers' bytes it would be 3 K / B);
    records name the real positions; emulated worker 5's 300 ms straggle holds every step back."""
    base = {**SYN, "strategy": "mapreduce", "workers": 8, "steps": 3, "workload.grad_mb": 2.0,
            "network.bandwidth": "1Gbit", "cluster.real_workers": 2}
    out = run_strategy(make_config(**base))
    steps, s = out["steps"], out["summary"]
    assert sorted(steps["worker"].unique()) == [0, 4] and s["real_workers"] == 2
    k, bandwidth = s["grad_bytes_logical"], 1e9 / 8
    assert s["step_time_p50_s"] >= 9 * k / bandwidth
    late = run_strategy(make_config(**{**base, "workload.compute_ms": 10.0}, straggler="fixed:worker=5,delay=300ms"))
    assert late["summary"]["step_time_p50_s"] >= 0.3
    assert (late["steps"]["injected_delay_s"] == 0).all()  # neither real worker straggled
