"""Strategy specs: what each strategy says of itself, and that the rest of the house asks it.

Every prediction is checked against the NIC emulator's own message-by-message schedule
(`testbed.emulation.network.simulate`), the trivially correct reference for the formulas.
"""

import ast
import math
from pathlib import Path

import pytest

from testbed.analysis.costmodel import NotModelled
from testbed.config import ConfigError, RunConfig, default_of, leaves, validate, with_overrides
from testbed.config.validate import strategy_keys
from testbed.emulation.network import LinkSpec, simulate
from testbed.strategies.registry import SPECS

K, A, B = 100e6, 1e-3, 1e9
ROOT = Path(__file__).resolve().parents[2]


def _cfg(**changes):
    return validate(with_overrides(RunConfig(), **changes), SPECS)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_spec_predicts_or_says_why_not(name):
    cfg = _cfg(strategy=name, workers=4)
    spec = SPECS[name]
    assert spec.bytes_per_worker(cfg, {"grad_bytes_logical": K}) > 0
    try:
        pred = spec.predict(cfg, {"grad_bytes_logical": K, "buckets": 1}, A, B)
    except NotModelled as exc:
        assert str(exc) and name == "allreduce-torch"
        return
    assert math.isfinite(pred.comm_s) and pred.comm_s > 0 and "K" in pred.formula


@pytest.mark.parametrize(("name", "changes", "expected"), [
    ("ring", {}, 0.189),
    ("ring", {"ring.algorithm": "halving-doubling"}, 0.181),
    # push-pull, one partition per server: each server's N replies trail its N pushes by one
    ("ps-sync", {"ps.shards": 2, "ps.partition_mb": 0.0}, 2 * A + (8 + 2) * K / (2 * B)),
    # a lone worker's push-pull: the second push overlaps the first reply
    ("ps-async", {"ps.shards": 2, "ps.partition_mb": 0.0}, 2 * A + 1.5 * K / B),
    ("ps-async", {"ps.shards": 2, "ps.staleness_bound": 1}, 2 * (A + K / (2 * B))),  # pulls first
    ("mapreduce", {}, 2 * A + (8 + 1) * K / B),  # pipelined
    ("gossip", {}, A + 2 * K / B),
])
def test_predict_literals(name, changes, expected):
    pred = SPECS[name].predict(_cfg(strategy=name, workers=8, **changes), {"grad_bytes_logical": K}, A, B)
    assert pred.comm_s == pytest.approx(expected)
    assert pred.comm_s_no_overlap is None or pred.comm_s_no_overlap >= pred.comm_s - 1e-12


def test_no_overlap_bounds_are_the_design_formulas():
    ps = SPECS["ps-sync"].predict(_cfg(strategy="ps-sync", workers=8, **{"ps.shards": 2}),
                                  {"grad_bytes_logical": K}, A, B)
    mr = SPECS["mapreduce"].predict(_cfg(strategy="mapreduce", workers=8), {"grad_bytes_logical": K}, A, B)
    assert ps.comm_s_no_overlap == pytest.approx(2 * (A + 8 * K / (2 * B)))
    assert mr.comm_s_no_overlap == pytest.approx(2 * (A + 8 * K / B))


def test_spec_keys_are_config_keys_and_every_key_has_a_flag():
    keys = {k for k, _ in leaves()}
    assert strategy_keys(SPECS) <= keys
    for spec in SPECS.values():
        assert set(spec.choices) <= set(spec.keys) | {k for k in keys if k not in strategy_keys(SPECS)}


def _another_value(key):
    """A value of `key` other than its default that its own check accepts: another of its owners'
    choices, the other boolean, a number one step away; spec strings by example."""
    examples = {"compression": "fp16", "faults.checkpoint_every": 5}
    if key in examples:
        return examples[key]
    default = default_of(key)
    own = getattr(dict(leaves())[key].metadata.get("check"), "options", ())
    choices = [c for spec in SPECS.values() for c in (*spec.choices.get(key, ()), *own) if c != default]
    if choices:
        return choices[0]
    if isinstance(default, bool):
        return not default
    if isinstance(default, float):
        return default / 2 if default > 0 else 1.0
    return 2 if default is None else default + 1


@pytest.mark.parametrize("key", sorted(strategy_keys(SPECS)))
def test_a_key_is_rejected_for_a_strategy_that_does_not_read_it(key):
    value = _another_value(key)
    for name, spec in SPECS.items():
        if key in spec.keys:
            continue
        with pytest.raises(ConfigError, match="applies to --strategy") as info:
            _cfg(strategy=name, **{key: value})
        owners = [n for n, s in SPECS.items() if key in s.keys]
        assert "/".join(owners) in str(info.value)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
@pytest.mark.parametrize("compression", ["none", "fp16", "topk:0.01"])
def test_compressed_mapreduce_predictions_match_the_nic_schedule(n, compression):
    """Pulls of K from the driver's NIC, then each worker's compressed push of P back (zero compute)."""
    link = LinkSpec(bandwidth=B, latency=A)
    for name in ("mapreduce",):  # (the parameter server's push-pull: test_ps_placement_model.py)
        cfg = _cfg(strategy=name, workers=n, compression=compression, workload=RunConfig().workload)
        pred = SPECS[name].predict(cfg, {"grad_bytes_logical": K}, A, B)
        push = cfg.compression.wire_bytes(K)
        pulls = simulate([("server", f"w{i}", K, 0.0) for i in range(n)], link)
        pushes = simulate([(f"w{i}", "server", push, t) for i, t in enumerate(pulls)], link)
        assert pred.comm_s == pytest.approx(max(pushes)), (name, pred.formula)
        assert pred.comm_s <= pred.comm_s_no_overlap * (1 + 1e-12)
        if compression != "none":
            assert "P" in pred.formula


def test_gossip_degree_is_capped_by_the_workers():
    two = SPECS["gossip"].predict(_cfg(strategy="gossip", workers=2, **{"gossip.topology": "complete"}),
                                  {"grad_bytes_logical": K}, A, B)
    assert two.comm_s == pytest.approx(A + K / B)
    alone = SPECS["gossip"].predict(_cfg(strategy="gossip", workers=1), {"grad_bytes_logical": K}, A, B)
    assert alone.comm_s == 0.0


@pytest.mark.parametrize(("name", "n", "changes", "expected"), [
    ("ring", 4, {}, 2 * K * 3 / 4),
    ("ring", 1, {}, 0.0),
    ("ring", 4, {"compression": "fp16"}, K * 3 / 4),
    ("ring", 4, {"compression": "topk:0.01"}, 3 * 0.02 * K),
    ("allreduce-torch", 8, {}, 2 * K * 7 / 8),
    ("ps-sync", 8, {"ps.shards": 4}, K),
    ("ps-async", 8, {"compression": "fp16"}, K / 2),
    ("mapreduce", 8, {}, K),
    ("gossip", 8, {"gossip.topology": "torus"}, 3 * K),
    ("gossip", 8, {"gossip.asynchronous": True}, K),
])
def test_bytes_per_worker(name, n, changes, expected):
    cfg = _cfg(strategy=name, workers=n, **changes)
    assert SPECS[name].bytes_per_worker(cfg, {"grad_bytes_logical": K}) == pytest.approx(expected)


def test_only_parameter_servers_place_servers():
    assert {n for n, s in SPECS.items() if s.servers(_cfg(strategy=n)) > 0} == {"ps-sync", "ps-async"}


# A strategy owns what is true of it: outside the registry and its own package nothing names it.
NAMES = sorted(SPECS)
OWN_DIRS = {type(spec).__module__.split(".")[1] for spec in SPECS.values()}


def _string_literals(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def test_no_strategy_name_outside_its_package_and_the_registry():
    leaks = []
    for path in sorted((ROOT / "testbed").rglob("*.py")):
        rel = path.relative_to(ROOT / "testbed")
        if rel.parts[0] in OWN_DIRS or rel.name == "registry.py":
            continue
        for line, text in _string_literals(path):
            for name in NAMES:
                # "ring" is also an algorithm and a topology; a bare "ring" literal is allowed
                # where it means those, so only the names that are nothing but strategies count
                if name != "ring" and (text == name or text.startswith(f"{name}:")
                                       or (name.startswith("ps-") and text == "ps-")):
                    leaks.append(f"testbed/{rel}:{line}: {text!r}")
        source = path.read_text()
        if 'startswith("ps' in source or "startswith('ps" in source:
            leaks.append(f"testbed/{rel}: startswith('ps...')")
    assert not leaks, "strategy names outside their packages:\n" + "\n".join(leaks)
