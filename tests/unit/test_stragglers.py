"""--straggler: the grammar (testbed.config.stragglerspec), determinism and the delays drawn
(testbed.emulation.stragglers), and the stretch of a slow worker's compute."""

import itertools
import random

import numpy as np
import pytest

from testbed.config.stragglerspec import (
    FixedDelay,
    RandomDelay,
    Slowdown,
    SporadicDelay,
    format_stragglers,
    parse_stragglers,
    validate_stragglers,
)
from testbed.emulation.stragglers import StragglerModel


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("none", ()),
        ("NONE", ()),
        ("fixed:worker=3,delay=200ms", (FixedDelay(3, 0.2),)),
        ("slowdown:worker=3,factor=2.5", (Slowdown(3, 2.5),)),
        ("random:dist=lognormal,sigma=0.5", (RandomDelay("lognormal", sigma=0.5, scale=0.01),)),
        (
            "random:dist=lognormal,sigma=0.5,scale=2ms",
            (RandomDelay("lognormal", sigma=0.5, scale=0.002),),
        ),
        ("random:dist=exponential,mean=10ms", (RandomDelay("exponential", mean=0.01),)),
        ("random:dist=exponential", (RandomDelay("exponential", mean=0.01),)),
        ("sporadic:p=0.05,delay=500ms", (SporadicDelay(0.05, 0.5),)),
        (
            "fixed:worker=0,delay=1s;sporadic:p=1,delay=0",
            (FixedDelay(0, 1.0), SporadicDelay(1.0, 0.0)),
        ),
        (
            "fixed:worker=0,delay=1s+slowdown:worker=1,factor=1",
            (FixedDelay(0, 1.0), Slowdown(1, 1.0)),
        ),
        ("none;fixed:worker=2,delay=1e+3ms", (FixedDelay(2, 1.0),)),
        (" fixed : worker = 1 , delay = 5ms ", (FixedDelay(1, 0.005),)),
    ],
)
def test_parse(text, expected):
    assert parse_stragglers(text) == expected


ROUND_TRIP = [
    "none",
    "fixed:worker=3,delay=200ms",
    "slowdown:worker=7,factor=2.5",
    "random:dist=lognormal,sigma=0.5,scale=10ms",
    "random:dist=exponential,mean=3us",
    "sporadic:p=0.05,delay=500ms",
    "fixed:worker=0,delay=0.1ms;sporadic:p=0.333,delay=1e-7s;random:dist=lognormal,sigma=0",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip(text):
    specs = parse_stragglers(text)
    assert parse_stragglers(format_stragglers(specs)) == specs
    for spec in specs:
        assert parse_stragglers(spec.to_text()) == (spec,)


def test_specs_are_hashable_and_frozen():
    specs = parse_stragglers(ROUND_TRIP[-1])
    assert len(set(specs)) == 3
    with pytest.raises(AttributeError):
        specs[0].delay = 1.0


BAD = [
    ("", "empty"),
    ("bogus:worker=1", "'bogus'"),
    ("fixed:worker=1", "'delay'"),
    ("fixed:delay=1s", "'worker'"),
    ("fixed:worker=1,delay=1s,extra=2", "'extra'"),
    ("fixed:worker=1,delay=1s,delay=2s", "'delay'"),
    ("fixed:worker=-1,delay=1s", "'-1'"),
    ("fixed:worker=1.5,delay=1s", "'1.5'"),
    ("fixed:worker=1,delay=-5ms", "'-5ms'"),
    ("fixed:worker=1,delay=5parsecs", "'5parsecs'"),
    ("fixed:worker=1,delay", "'delay'"),
    ("slowdown:worker=1,factor=0.5", "'0.5'"),
    ("slowdown:worker=1,factor=nan", "'nan'"),
    ("slowdown:worker=1,factor=abc", "'abc'"),
    ("sporadic:p=1.5,delay=1s", "'1.5'"),
    ("sporadic:p=-0.1,delay=1s", "'-0.1'"),
    ("sporadic:p=0.1,delay=-1s", "'-1s'"),
    ("random:dist=cauchy", "'cauchy'"),
    ("random:dist=lognormal", "'sigma'"),
    ("random:dist=lognormal,sigma=-1", "'-1'"),
    ("random:dist=lognormal,sigma=1,mean=2ms", "'mean'"),
    ("random:dist=exponential,sigma=1", "'sigma'"),
    ("random:dist=exponential,mean=-1ms", "'-1ms'"),
    ("fixed:worker=1,delay=1s;;none", "empty item"),
]


@pytest.mark.parametrize(("text", "needle"), BAD)
def test_bad_specs_rejected_naming_value(text, needle):
    with pytest.raises(ValueError) as info:
        parse_stragglers(text)
    message = str(info.value)
    assert message.startswith("--straggler ")
    assert needle in message
    assert "\n" not in message


def test_validate_worker_range():
    specs = parse_stragglers("fixed:worker=99,delay=1s")
    with pytest.raises(ValueError) as info:
        validate_stragglers(specs, 8)
    assert "worker=99" in str(info.value)
    assert "worker must be in 0..7 (there are 8 workers)" in str(info.value)
    with pytest.raises(ValueError, match="0..7"):
        validate_stragglers(parse_stragglers("slowdown:worker=8,factor=2"), 8)
    validate_stragglers(parse_stragglers("fixed:worker=7,delay=1s;slowdown:worker=0,factor=2"), 8)
    validate_stragglers(parse_stragglers("sporadic:p=1,delay=1s;random:dist=exponential"), 1)


def test_no_specs_no_delay():
    model = StragglerModel((), seed=0)
    assert all(model.delay(w, i, 1.0) == 0.0 for w in range(4) for i in range(10))


def test_fixed_delay_exact():
    model = StragglerModel("fixed:worker=3,delay=200ms", seed=1)
    for it in range(20):
        assert model.delay(3, it) == 0.2
        assert model.delay(2, it) == 0.0


def test_slowdown_exact():
    model = StragglerModel(parse_stragglers("slowdown:worker=1,factor=2.5"), seed=1)
    assert model.delay(1, 0, compute_s=0.04) == pytest.approx(1.5 * 0.04)
    assert model.delay(1, 5, compute_s=0.0) == 0.0
    assert model.delay(0, 0, compute_s=0.04) == 0.0


def test_specs_add_up():
    model = StragglerModel(
        "fixed:worker=1,delay=10ms;slowdown:worker=1,factor=3;sporadic:p=1,delay=1s", seed=0
    )
    assert model.delay(1, 0, compute_s=0.1) == pytest.approx(0.01 + 0.2 + 1.0)
    assert model.delay(0, 0, compute_s=0.1) == pytest.approx(1.0)


RANDOM = "random:dist=lognormal,sigma=0.5;sporadic:p=0.3,delay=50ms;random:dist=exponential"
KEYS = [(w, i) for w in range(4) for i in range(25)]


def test_same_seed_identical_delays():
    a = StragglerModel(RANDOM, seed=42)
    b = StragglerModel(RANDOM, seed=42)
    assert [a.delay(w, i) for w, i in KEYS] == [b.delay(w, i) for w, i in KEYS]


def test_different_seed_different_delays():
    a = StragglerModel(RANDOM, seed=42)
    b = StragglerModel(RANDOM, seed=43)
    assert [a.delay(w, i) for w, i in KEYS] != [b.delay(w, i) for w, i in KEYS]


def test_order_independent_and_repeatable():
    forward = StragglerModel(RANDOM, seed=7)
    expected = {key: forward.delay(*key) for key in KEYS}
    shuffled = KEYS * 2
    random.Random(0).shuffle(shuffled)
    other = StragglerModel(RANDOM, seed=7)
    assert {key: other.delay(*key) for key in shuffled} == expected


def test_workers_and_iterations_get_different_draws():
    model = StragglerModel("random:dist=exponential,mean=10ms", seed=0)
    values = [model.delay(w, i) for w, i in KEYS]
    assert len(set(values)) == len(values)


def test_lognormal_matches_reference_draw():
    model = StragglerModel("random:dist=lognormal,sigma=0.5,scale=10ms", seed=5)
    ref = 0.01 * np.random.default_rng([5, 2, 9, 0]).lognormal(0.0, 0.5)
    assert model.delay(2, 9) == ref


def test_lognormal_median_is_scale():
    model = StragglerModel("random:dist=lognormal,sigma=0.5,scale=10ms", seed=3)
    draws = [model.delay(0, i) for i in range(4000)]
    assert np.median(draws) == pytest.approx(0.01, rel=0.05)


def test_exponential_mean():
    model = StragglerModel("random:dist=exponential,mean=20ms", seed=3)
    draws = [model.delay(w, i) for w, i in itertools.product(range(4), range(1000))]
    assert np.mean(draws) == pytest.approx(0.02, rel=0.07)


@pytest.mark.parametrize("p", [0.05, 0.5])
def test_sporadic_frequency(p):
    model = StragglerModel(f"sporadic:p={p},delay=500ms", seed=11)
    draws = [model.delay(w, i) for w, i in itertools.product(range(8), range(2500))]
    assert set(draws) <= {0.0, 0.5}
    freq = sum(d > 0 for d in draws) / len(draws)
    # 20000 Bernoulli draws: std <= 0.0036, so 0.02 is > 5 sigma.
    assert abs(freq - p) < 0.02


def test_sporadic_extremes():
    never = StragglerModel("sporadic:p=0,delay=1s", seed=0)
    always = StragglerModel("sporadic:p=1,delay=1s", seed=0)
    assert all(never.delay(0, i) == 0.0 and always.delay(0, i) == 1.0 for i in range(200))


@pytest.mark.parametrize(
    ("args", "needle"),
    [((-1, 0), "worker -1"), ((0, -1), "iteration -1"), ((0, 0, -0.5), "compute_s -0.5")],
)
def test_delay_rejects_bad_arguments(args, needle):
    with pytest.raises(ValueError, match=needle):
        StragglerModel("none", seed=0).delay(*args)


def test_bad_seed_rejected():
    with pytest.raises(ValueError, match="seed -1"):
        StragglerModel("none", seed=-1)


def test_validate_rejects_bad_worker_count():
    with pytest.raises(ValueError, match="workers 0"):
        validate_stragglers((), 0)
