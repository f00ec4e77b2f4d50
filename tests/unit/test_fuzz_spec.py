"""Hostile sweep specs: any TOML either expands into valid points or fails with one line."""

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.config import ConfigError
from testbed.strategies.registry import SPECS
from testbed.sweep.spec import expand, load_spec

KEYS = st.sampled_from(["strategy", "workers", "steps", "seed", "workload", "straggler", "repeats",
                        "workload.grad_mb", "ps.shards", "network.bandwidth", "ring.overlap",
                        "nonsense", "out", "name"])
SCALARS = st.one_of(st.integers(-5, 20), st.floats(allow_nan=False, width=32), st.booleans(),
                    st.sampled_from(["ring", "ps-sync", "mapreduce", "synthetic", "1Gbit", "none", "x"]))


def _toml(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, float) and value != value:
        return "nan"
    return repr(value) if not isinstance(value, float) else f"{value!r}".replace("inf", "inf")


SPEC = st.tuples(st.dictionaries(KEYS, SCALARS, max_size=4),
                 st.dictionaries(KEYS, st.lists(SCALARS, max_size=3), max_size=3))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SPEC)
def test_spec_expands_or_fails_with_one_line(spec):
    base, grid = spec
    lines = ["[base]"] + [f'"{k}" = {_toml(v)}' for k, v in base.items()]
    lines += ["[grid]"] + [f'"{k}" = [{", ".join(_toml(v) for v in vs)}]' for k, vs in grid.items()]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.toml"
        path.write_text("\n".join(lines) + "\n")
        try:
            expand(load_spec(path), SPECS, str(Path(tmp) / "runs"))
        except ConfigError as exc:
            assert str(exc) and "\n" not in str(exc)


def test_broken_toml_is_a_config_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[grid\nworkers = [1,\n")
    try:
        load_spec(path)
    except ConfigError as exc:
        assert "bad.toml" in str(exc) and "\n" not in str(exc)
    else:
        raise AssertionError("a broken TOML file must be rejected")
