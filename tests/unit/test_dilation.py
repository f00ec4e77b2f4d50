"""Time dilation (testbed.emulation.dilation): what is stretched, what is reported, the advice."""

from __future__ import annotations

import math

import pytest

from testbed.analysis import keys
from testbed.analysis.records import Recorder, StepRecord, UpdateRecord
from testbed.config import NetworkConfig
from testbed.emulation.dilation import (
    FIDELITY_TOLERANCE,
    FIRST_SHARE,
    LEAK_LIMIT,
    MAX_GROWTH,
    MIN_GROWTH,
    Dilation,
    advice,
    affordable_factor,
    faithful,
    first_factor,
    is_duration,
    is_instant,
    is_rate,
    late_below,
    next_factor,
    run_seconds,
    wanted_factor,
)
from testbed.emulation.endpoint import Endpoint
from testbed.emulation.stragglers import StragglerModel
from testbed.strategies import registry


def test_instants_move_towards_the_origin_and_durations_shrink():
    d = Dilation(4.0, origin=1000.0)
    assert d.instant(1000.0) == 1000.0 and d.instant(1008.0) == 1002.0
    assert d.duration(2.0) == 0.5
    row = d.row({"t_start": 1004.0, "comm_s": 0.4, "bytes_sent": 10, "loss": 0.5, "algbw_Bps": 1e6,
                 "allreduce_s_p50": 0.8, "staleness": None, "phase": "recv"})
    assert row == {"t_start": 1001.0, "comm_s": 0.1, "bytes_sent": 10, "loss": 0.5, "algbw_Bps": 4e6,
                   "allreduce_s_p50": 0.2, "staleness": None, "phase": "recv"}


def test_extras_take_lists_of_durations_and_rows():
    d = Dilation(2.0, origin=0.0)
    out = d.extras({"bucket_allreduce_s": [0.2, 0.4], "faults": [{"t0": 10.0, "time_lost_s": 1.0, "actor": "w"}],
                    "ps_shards": 2, "server_busy_frac": [0.5]})
    assert out == {"bucket_allreduce_s": [0.1, 0.2], "faults": [{"t0": 5.0, "time_lost_s": 0.5, "actor": "w"}],
                   "ps_shards": 2, "server_busy_frac": [0.5]}


def test_a_factor_below_one_runs_faster_than_real_time_and_reports_the_same_way():
    """D = 0.25: the emulated cluster runs 4x faster than real time; a real second is 4 emulated
    ones, and the link is 4x faster with a quarter of the latency. Zero and below are refused."""
    d = Dilation(0.25, origin=10.0)
    assert d.instant(11.0) == 14.0 and d.duration(0.5) == 2.0
    assert d.value("algbw_Bps", 1e6) == pytest.approx(0.25e6)
    link = Endpoint(NetworkConfig(bandwidth="8Gbit", latency="40us", dilation=0.25), "w").nic.link
    assert link.bandwidth == pytest.approx(4e9) and link.latency == pytest.approx(10e-6)
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match=f"dilation {bad!r}"):
            Dilation(bad, 0.0)


def _unit(text: str) -> str:
    return text.split(":", 1)[0].strip() if ":" in text else ""


def test_every_documented_time_is_named_by_the_convention():
    """Dilation finds times by name; a column or strategy key whose unit is seconds (or an epoch,
    or a rate) but whose name says otherwise would silently stay undilated."""
    documented = {**keys.STEP_COLUMNS, **keys.UPDATE_COLUMNS, **keys.EVENT_COLUMNS}
    named = {k: unit for k, (unit, _) in documented.items()}
    for spec in registry.SPECS.values():
        named.update({k: _unit(v) for k, v in spec.summary_keys.items()})
    for key, unit in named.items():
        assert is_instant(key) == (unit == "s (epoch)"), (key, unit)
        assert is_duration(key) == (unit == "s"), (key, unit)
        assert is_rate(key) == unit.endswith("/s"), (key, unit)


def test_recorder_stores_rows_in_the_emulated_clock():
    rec = Recorder()
    rec.dilation = Dilation(10.0, origin=100.0)
    rec.step(StepRecord("r", "ring", 0, 0, 0, 1, 110.0, 1.0, 2.0, 0.5, 8, 8, 4, 0.1, 0, 0.3, 0.2))
    rec.update(UpdateRecord(1, 120.0, 1, 0, 0.1))
    rec.event("worker0", "compute", 110.0, 111.0)
    rec.fault("nan-skipped", "worker0", 0, 130.0, 140.0)
    s = rec.steps[0]
    assert (s["t_start"], s["compute_s"], s["comm_s"], s["wait_s"], s["injected_delay_s"], s["late_s"]) == \
        pytest.approx((101.0, 0.1, 0.2, 0.05, 0.03, 0.02))
    assert rec.updates[0]["t_applied"] == pytest.approx(102.0)
    assert (rec.events[0]["t0"], rec.events[0]["t1"]) == pytest.approx((101.0, 101.1))
    fault = rec.extra["faults"][0]
    assert (fault["t0"], fault["time_lost_s"]) == pytest.approx((103.0, 1.0))
    assert rec.first_update_at is not None  # start-up figures use the real clock


def test_endpoint_link_is_dilated():
    net = NetworkConfig(bandwidth="8Gbit", latency="50us", dilation=4.0)
    link = Endpoint(net, "w").nic.link
    assert link.bandwidth == pytest.approx(1e9 / 4) and link.latency == pytest.approx(200e-6)


def test_lateness_carried_from_the_message_before_is_counted_once():
    """Two messages handled one after the other, the first 1 s late: the second, arriving just
    after it, adds only its own 10 ms, not the first one's second again."""
    ep = Endpoint(NetworkConfig(bandwidth="8Gbit", latency="50us"), "w")
    due1 = ep.nic.link.one_way_s(1000) + 100.0
    assert ep.delivery(1000, 100.0, arrived=due1 + 1.0) == pytest.approx(due1)
    assert ep.late_s == pytest.approx(1.0) and ep.late_messages == 1
    ep.delivery(1000, 100.0, arrived=due1 + 1.01)
    assert ep.late_s == pytest.approx(1.01) and ep.late_messages == 2
    ep.delivery(1000, 200.0, arrived=200.5)  # later, fresh lateness: counted from its due time
    assert ep.late_s == pytest.approx(1.01 + 0.5 - ep.nic.link.one_way_s(1000))


def test_additive_straggler_delays_are_slept_dilated_and_slowdowns_stay_factors():
    model = StragglerModel("fixed:worker=0,delay=100ms;slowdown:worker=0,factor=2", seed=0, dilation=5.0)
    stretch = model.stretch(0, 0, clock=lambda: 0.0, sleep=lambda s: None)
    assert stretch.additive == pytest.approx(0.5) and stretch.factor == 2.0


def test_advice_is_silent_within_the_tolerance():
    assert advice(1.0 + FIDELITY_TOLERANCE * 0.9, 1.0, 1.0, True) is None
    assert advice(1.0 - FIDELITY_TOLERANCE * 0.9, 1.0, 1.0, True) is None


@pytest.mark.parametrize(("ratio", "dilation"), [(1.6, 1.0), (5.16, 1.0), (1.2, 25.0), (1.06, 4.0)])
def test_advised_dilation_brings_the_excess_to_half_the_tolerance(ratio, dilation):
    """The excess is real seconds (excess x D); at the advised D' it is excess x D / D'."""
    line = advice(ratio, 1.0, dilation, True)
    better = float(line.split("--dilation ")[1].split()[0])
    assert better > dilation
    assert (ratio - 1) * dilation / better <= FIDELITY_TOLERANCE / 2 + 1e-12
    assert (ratio - 1) * dilation / (better - 1) > FIDELITY_TOLERANCE / 2 or better == 2
    assert f"{ratio:.2f}x" in line and "\n" not in line


def test_advice_below_the_model_and_for_real_compute_offers_no_dilation():
    assert "--dilation" not in advice(0.8, 1.0, 1.0, True)
    line = advice(1.5, 1.0, 1.0, False)
    assert "--dilation" not in line.split(":", 1)[1] or "cannot be dilated" in line
    assert advice(math.nan, 1.0, 1.0, True) is None and advice(1.0, 0.0, 1.0, True) is None
    assert "--dilation" not in advice(0.8, 1.0, 1.0, True, leak=0.19)  # late by less than the shortfall: the model's


@pytest.mark.parametrize(("leak", "dilation"), [(1.73, 4.0), (0.6, 1.0), (20.0, 12.0)])
def test_below_the_model_with_a_late_emulator_advises_the_dilation_that_absorbs_the_lateness(leak, dilation):
    """The N = 64, S = 8 run: 0.92x at leak 1.73 (D = 4); D' scales the leak to LEAK_LIMIT."""
    line = advice(0.92, 1.0, dilation, True, leak=leak)
    better = float(line.split("--dilation ")[1].split()[0])
    assert better > dilation and leak * dilation / better <= LEAK_LIMIT + 1e-12
    assert f"{leak:.2f}x" in line and "\n" not in line
    assert "--dilation" not in advice(0.92, 1.0, dilation, False, leak=leak)  # real compute: no dilation


# ---------------------------------------------------------------- --dilation auto's policy


def test_faithful_needs_the_fidelity_within_the_tolerance_and_the_emulator_on_time():
    assert faithful(1.0, 0.0) and faithful(1 + FIDELITY_TOLERANCE / 2, None) and faithful(1 - FIDELITY_TOLERANCE / 2, LEAK_LIMIT)
    assert not faithful(1 + 2 * FIDELITY_TOLERANCE, 0.0)
    assert not faithful(1.0, 2 * LEAK_LIMIT)  # on the model by luck, with late messages reordering queues
    assert faithful(None, 0.0) is None and faithful(float("nan"), 0.0) is None


@pytest.mark.parametrize("dilation", [1.0, 4.0, 30.0])
@pytest.mark.parametrize("fidelity,leak", [(3.0, 0.0), (1.3, 0.0), (1.07, 0.0), (0.8, 1.5)])
def test_the_search_raises_the_factor_by_the_root_of_the_advice_within_its_growth_limits(dilation, fidelity, leak):
    nxt = next_factor(dilation, fidelity, leak)
    wanted = wanted_factor(dilation, fidelity, leak)
    assert wanted > dilation
    growth = min(MAX_GROWTH, max(MIN_GROWTH, math.sqrt(wanted / dilation)))
    assert nxt == math.ceil(dilation * growth)  # never the whole advice at once: the excess falls faster than 1/D
    assert dilation * MIN_GROWTH <= nxt <= dilation * MAX_GROWTH + 1


def test_a_busier_machine_gets_a_factor_at_least_as_large():
    """More excess measured at the same factor (a busier machine) never asks for less dilation."""
    factors = [next_factor(2.0, fidelity, 0.0) for fidelity in (1.06, 1.2, 1.5, 2.0, 4.0, 10.0, 100.0)]
    assert factors == sorted(factors) and factors[-1] > factors[0]
    # on the model by chance, with more of its messages late: the same, read from the leak
    late = [next_factor(2.0, 1.0, leak) for leak in (2 * LEAK_LIMIT, 8 * LEAK_LIMIT, 100 * LEAK_LIMIT)]
    assert late == sorted(late) and late[-1] > late[0]


@pytest.mark.parametrize("dilation", [0.07, 0.3])
def test_from_below_one_the_search_raises_by_the_same_rule_to_two_significant_digits(dilation):
    """A first trial faster than real time (`first_factor`) that measured too much: the next
    factor is the same root rule, rounded up to two significant digits while below 1, and the
    rule's whole numbers from 1 on."""
    for fidelity in (1.06, 1.3, 3.0):
        nxt = next_factor(dilation, fidelity, 0.0)
        growth = min(MAX_GROWTH, max(MIN_GROWTH, math.sqrt(wanted_factor(dilation, fidelity, 0.0) / dilation)))
        raised = dilation * growth
        assert nxt >= raised - 1e-12
        if raised < 1:
            assert nxt - raised < 0.1 * raised and float(f"{nxt:.2g}") == nxt
        else:
            assert nxt == math.ceil(raised)


def test_the_first_factor_is_one_unless_the_model_says_the_run_takes_most_of_the_budget():
    """The first trial and the run within half the budget at D = 1: start there. Longer (by the
    model): the factor that fits them in that half, two significant digits rounded down, never
    below the floor; no prediction: 1."""
    assert first_factor(None, 300.0, 0.01) == first_factor(0.0, 300.0, 0.01) == 1.0
    assert first_factor(FIRST_SHARE * 300.0, 300.0, 0.01) == 1.0
    d = first_factor(520.0, 300.0, 0.01)  # mapreduce N = 128, 1.2 GB, 10 Gbit/s, 4 updates
    assert d == 0.28 and 520.0 * d <= FIRST_SHARE * 300.0 < 520.0 * (d + 0.01)
    assert first_factor(1e9, 300.0, 0.01) == 0.01


def test_advice_from_below_one_may_stay_below_one():
    """A run at D = 0.1 measuring 1.2x: the excess, 0.2 x 0.1 real seconds per emulated one,
    falls to half the tolerance at D' = 0.8, which the advice names (at least twice the factor)."""
    line = advice(1.2, 1.0, 0.1, True)
    better = float(line.split("--dilation ")[1].split()[0])
    assert better == 0.8 and 0.2 * 0.1 / better <= FIDELITY_TOLERANCE / 2 + 1e-12
    # late by 0.6x at D = 0.1: 0.12 would absorb it, the advice doubles the factor at least
    assert float(advice(0.92, 1.0, 0.1, True, leak=0.6).split("--dilation ")[1].split()[0]) == 0.2


@pytest.mark.parametrize("dilation", [1.0, 4.0])
def test_below_the_model_by_no_more_than_it_ran_late_the_search_raises_the_factor(dilation):
    """ps-sync at N = 128, D = 1: 0.949x with a leak of 0.345, where another run of the same
    config measured 1.001x with 0.115. The lateness accounts for the shortfall, so the next trial
    is dilated (D x 0.345 / 0.051 wanted, the root of it taken), and the advice says the same."""
    assert late_below(0.949, 0.345) and not late_below(0.949, 0.04) and not late_below(0.949, None)
    assert wanted_factor(dilation, 0.949, 0.345) == pytest.approx(dilation * 0.345 / 0.051)
    assert next_factor(dilation, 0.949, 0.345) == math.ceil(dilation * math.sqrt(0.345 / 0.051))
    better = float(advice(0.949, 1.0, dilation, True, leak=0.345).split("--dilation ")[1].split()[0])
    assert better >= dilation * 0.345 / 0.051 and "ran late by 0.34x" in advice(0.949, 1.0, dilation, True, leak=0.345)


def test_the_search_stops_where_more_dilation_cannot_help():
    assert next_factor(4.0, 0.8, 0.1) is None  # below the model by more than it ran late: not this machine
    assert next_factor(4.0, 1.5, 0.0, ceiling=4.0) is None
    assert next_factor(4.0, 1.5, 0.0, ceiling=6.0) == 6.0


def test_the_affordable_factor_fits_one_more_trial_and_the_run_in_the_time_left():
    step_s, setup_s, trial, run = 0.05, 3.0, 6, 100
    assert affordable_factor(10.0, trial, run, step_s, setup_s, 1e9) == 10.0
    left = 60.0
    d = affordable_factor(1000.0, trial, run, step_s, setup_s, left)
    assert 1 <= d < 1000
    cost = run_seconds(d, trial, step_s, setup_s) + run_seconds(d, run, step_s, setup_s)
    assert cost <= left < run_seconds(d + 1, trial, step_s, setup_s) + run_seconds(d + 1, run, step_s, setup_s)


def test_a_trial_that_is_the_whole_run_pays_for_itself_only():
    """run_steps 0: the next trial is the run, so the time left buys one start-up and its steps."""
    step_s, setup_s, steps, left = 0.35, 3.0, 4, 200.0
    d = affordable_factor(1000.0, steps, 0, step_s, setup_s, left)
    assert run_seconds(d, steps, step_s, setup_s) <= left < run_seconds(d + 1, steps, step_s, setup_s)
    assert d > affordable_factor(1000.0, steps, steps, step_s, setup_s, left)  # than with a run after it


def test_a_late_compute_is_not_faithful_and_asks_for_its_own_factor():
    """ps-async N = 256 at D = 8: communication 1.028x, compute 1.07x (its first iterations all
    start together): not faithful, and the search raises D for the compute as it would for the
    same excess of communication."""
    assert faithful(1.028, 0.0) and not faithful(1.028, 0.0, 1.07) and faithful(1.028, 0.0, 1.04)
    assert wanted_factor(8.0, 1.028, 0.0, 1.07) == pytest.approx(wanted_factor(8.0, 1.07, 0.0))
    assert next_factor(8.0, 1.028, 0.0, compute=1.07) == next_factor(8.0, 1.07, 0.0)
    assert next_factor(8.0, 1.028, 0.0, compute=1.02) is None  # on time: nothing to raise
    # the larger of the two asks: a late compute never lowers what communication wants
    assert wanted_factor(8.0, 1.5, 0.0, 1.07) == wanted_factor(8.0, 1.5, 0.0)
    # below the model by more than it ran late, a late compute still asks for dilation
    assert next_factor(4.0, 0.8, 0.1) is None and next_factor(4.0, 0.8, 0.1, compute=1.2) > 4.0
