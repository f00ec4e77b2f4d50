"""Sweep spec checks, grid expansion and point ids (no Ray: the registry of specs is pure)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
import pytest

from testbed.config import ConfigError
from testbed.strategies.registry import SPECS
from testbed.sweep.spec import applies, expand, flat_config, load_spec, spec_dict

BASE = """
[base]
workload = "synthetic"
steps = 3
"""


def spec(tmp_path, body: str, name: str = "t"):
    path = tmp_path / f"{name}.toml"
    path.write_text(textwrap.dedent(body))
    return path


def points(tmp_path, body: str, out: str | None = None):
    s = load_spec(spec(tmp_path, body))
    return expand(s, SPECS, out or str(tmp_path / "runs"))


@pytest.mark.parametrize(("body", "needle"), [
    ('colour = "red"\n' + BASE, "'colour'"),
    (BASE + "workers_count = 2\n", "base.workers_count"),
    (BASE + '[grid]\n"ps.shard" = [1, 2]\n', "grid.ps.shard"),
    (BASE + "[grid]\nworkers = []\n", "grid.workers is an empty list"),
    (BASE + "[grid]\nworkers = 4\n", "grid.workers = 4 must be a list"),
    ("repeats = 0\n" + BASE, "repeats 0"),
    ('repeats = "2"\n' + BASE, "repeats '2'"),
    ("repeats = true\n" + BASE, "repeats True"),
    (BASE + 'workers = "four"\n', "base.workers = 'four': expected int"),
    (BASE + '[grid]\n"ring.overlap" = ["yes"]\n', "grid.ring.overlap = 'yes': expected bool"),
    (BASE + '[grid]\n"ps.shards" = ["none"]\n', "grid.ps.shards = 'none': expected int"),
    (BASE + 'out = "/tmp"\n', "base.out is set by the sweep"),
    (BASE + "workers = 2\n[grid]\nworkers = [1, 2]\n", "workers is in both [base] and [grid]"),
    ('[base]\n"workload.grad_mb" = 1\n[base.workload]\ngrad_mb = 2\n', "workload.grad_mb is given twice"),
    ('name = "../evil"\n' + BASE, "name '../evil'"),
    ("base = 3\n", "base must be a table"),
    ("[base\n", "not valid TOML"),
])
def test_bad_spec_names_the_key(tmp_path, body, needle):
    with pytest.raises(ConfigError) as err:
        points(tmp_path, body)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("grid", "needle"), [
    ("workers = [2, 0]", "--workers 0"),
    ('strategy = ["ring", "gossipy"]', "--strategy 'gossipy'"),
    ('"workload.grad_mb" = [-1]', "--grad-mb -1.0"),
    ('straggler = ["fixed:worker=5,delay=1ms"]', "worker"),
    ('"network.latency" = ["50us"]', "--latency '50us'"),
])
def test_every_grid_point_is_validated(tmp_path, grid, needle):
    with pytest.raises(ConfigError) as err:
        points(tmp_path, BASE + "workers = 2\n" * ("workers" not in grid) + f"[grid]\n{grid}\n")
    msg = str(err.value)
    assert needle in msg and "point {" in msg


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the spec"):
        load_spec(tmp_path / "nope.toml")


def test_grid_is_a_cartesian_product_repeat_major(tmp_path):
    pts, skipped = points(tmp_path, "repeats = 2\n" + BASE + """
        [grid]
        strategy = ["mapreduce", "ring"]
        workers = [1, 2, 4]
    """)
    assert skipped == []
    assert len(pts) == 12
    assert [(p.config.strategy, p.config.workers) for p in pts[:6]] == [
        ("mapreduce", 1), ("mapreduce", 2), ("mapreduce", 4), ("ring", 1), ("ring", 2), ("ring", 4)]
    assert [p.repeat for p in pts] == [0] * 6 + [1] * 6
    assert len({p.point_id for p in pts}) == 12
    cfg = pts[0].config
    assert cfg.quiet and cfg.out == str(tmp_path / "runs") and cfg.workload.name == "synthetic"


def test_name_defaults_to_file_stem(tmp_path):
    assert load_spec(spec(tmp_path, BASE, name="scaling")).name == "scaling"


def test_dotted_keys_tables_and_aliases_are_the_same_point(tmp_path):
    a, _ = points(tmp_path, '[base]\nworkload = "synthetic"\n"workload.grad_mb" = 2\n')
    b, _ = points(tmp_path, '[base.workload]\nname = "synthetic"\ngrad_mb = 2.0\n')
    assert a[0].config == b[0].config
    assert a[0].point_id == b[0].point_id


def test_point_ids_are_deterministic(tmp_path):
    body = BASE + '[grid]\nstrategy = ["mapreduce", "ring"]\nworkers = [1, 2]\n'
    first, _ = points(tmp_path, body)
    again, _ = points(tmp_path, body, out=str(tmp_path / "elsewhere"))
    assert [p.point_id for p in first] == [p.point_id for p in again]
    changed, _ = points(tmp_path, body.replace("steps = 3", "steps = 4"))
    assert not {p.point_id for p in first} & {p.point_id for p in changed}


def test_none_maps_to_none(tmp_path):
    pts, _ = points(tmp_path, BASE + """
        strategy = "ps-async"
        workers = 2
        [grid]
        "ps.staleness_bound" = ["none", 2]
        "network.bandwidth" = ["none"]
    """)
    assert [p.config.ps.staleness_bound for p in pts] == [None, 2]
    assert pts[0].config.network.bandwidth is None


def test_keys_that_do_not_apply_are_reset_and_duplicates_skipped(tmp_path):
    pts, skipped = points(tmp_path, BASE + """
        workers = 4
        [grid]
        strategy = ["ps-sync", "ps-async"]
        "ps.backup_workers" = [0, 1]
        "ps.staleness_bound" = ["none", 2]
    """)
    got = [(p.config.strategy, p.config.ps.backup_workers, p.config.ps.staleness_bound) for p in pts]
    assert got == [("ps-sync", 0, None), ("ps-sync", 1, None), ("ps-async", 0, None), ("ps-async", 0, 2)]
    assert len(skipped) == 4
    assert all("same_as" in s and "values" in s for s in skipped)


def test_ring_keys_do_not_split_other_strategies(tmp_path):
    pts, skipped = points(tmp_path, BASE + """
        [grid]
        strategy = ["mapreduce", "ring"]
        "ring.bucket_mb" = [0.25, 1]
        "ps.shards" = [1, 2]
    """)
    assert [(p.config.strategy, p.config.ring.bucket_mb) for p in pts] == [
        ("mapreduce", 25.0), ("ring", 0.25), ("ring", 1.0)]
    assert len(skipped) == 5


def test_applies():
    assert applies("ps.shards", "ps-async", SPECS)
    assert not applies("ps.shards", "ring", SPECS)
    assert applies("ps.staleness_bound", "ps-async", SPECS)
    assert not applies("ps.staleness_bound", "ps-sync", SPECS)
    assert applies("ps.backup_workers", "ps-sync", SPECS)
    assert not applies("ring.overlap", "mapreduce", SPECS)
    assert applies("ring.overlap", "allreduce-torch", SPECS)
    assert not applies("ring.transport", "allreduce-torch", SPECS)
    assert applies("network.bandwidth", "mapreduce", SPECS)


def test_flat_config_has_every_key(tmp_path):
    pts, _ = points(tmp_path, BASE)
    flat = flat_config(pts[0].config)
    assert flat["workload.name"] == "synthetic" and flat["steps"] == 3
    assert "out" not in flat and "quiet" not in flat
    assert {"network.bandwidth", "ps.shards", "ring.bucket_mb", "cluster.timeout_s"} <= set(flat)


def test_spec_dict_is_what_the_spec_asks_for(tmp_path):
    s = load_spec(spec(tmp_path, 'name = "x"\nrepeats = 2\n' + BASE + '[grid]\nworkers = [1, 2]\n'))
    assert spec_dict(s) == {"name": "x", "repeats": 2, "base": {"workload.name": "synthetic", "steps": 3},
                            "grid": {"workers": [1, 2]}}


def test_sweep_module_still_exports_the_spec_functions():
    from testbed import sweep
    from testbed.sweep import spec

    assert sweep.load_spec is spec.load_spec and sweep.expand is spec.expand


def test_the_sweep_help_says_what_the_command_docstring_says():
    from testbed.sweep import cli, runner

    assert cli.__doc__.split("\n")[0] == runner.DESCRIPTION


def test_grid_tables_give_the_union_of_their_products(tmp_path):
    path = tmp_path / "two.toml"
    path.write_text('[base]\nworkload = "synthetic"\n"network.bandwidth" = "1Gbit"\n'
                    '[[grid]]\nstrategy = ["ring"]\nworkers = [2, 4]\n"network.dilation" = [10]\n'
                    '[[grid]]\nstrategy = ["mapreduce"]\nworkers = [2]\n')
    spec = load_spec(path)
    points, skipped = expand(spec, SPECS, str(tmp_path / "runs"))
    got = [(p.config.strategy, p.config.workers, p.config.network.dilation) for p in points]
    # a point that leaves --dilation out gets the default: auto on this emulated network
    assert got == [("ring", 2, 10.0), ("ring", 4, 10.0), ("mapreduce", 2, "auto")] and not skipped
    assert spec.grid == {"strategy": ["ring", "mapreduce"], "workers": [2, 4], "network.dilation": [10.0]}
    assert isinstance(spec_dict(spec)["grid"], list)
    path.write_text("grid = []\n[base]\nworkers = 2\n")
    with pytest.raises(ConfigError, match="empty array"):
        load_spec(path)


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "experiments").glob("*.toml")),
                         ids=lambda p: p.stem)
def test_every_committed_spec_expands_to_valid_points(path, tmp_path):
    """What the README tells users to run parses, and every point passes the run's validation."""
    points, _ = expand(load_spec(path), SPECS, str(tmp_path))
    assert points and all(p.config.strategy in SPECS for p in points)


@pytest.mark.parametrize("second_look", [0, 1])
def test_check_confirms_a_drift_by_running_every_point_once_more(tmp_path, monkeypatch, capsys, second_look):
    """--check's first look finds a drift: every point runs again as the next repeat (new ids),
    and the exit code is the second look's (the runs and the comparison are replaced by fakes)."""
    import argparse

    from testbed.sweep import runner

    spec = load_spec(Path(__file__).resolve().parents[2] / "experiments" / "regression.toml")
    points, skipped = expand(spec, SPECS, str(tmp_path / "runs"))
    ran, looks = [], []
    monkeypatch.setattr(runner, "_finish", lambda _s, _all, todo, *a, **k: ran.append(list(todo)) or 0)

    def look(*_a, say=True, **_k):
        looks.append(say)
        return 1 if len(looks) == 1 else second_look
    monkeypatch.setattr(runner.sweepcheck, "check_sweep", look)
    args = argparse.Namespace(update_baseline=False, check=True, quiet=True, baseline="b.json")
    code = runner._main(args, spec, tmp_path, {}, points, skipped, reference={"ratios": {}})
    assert code == second_look and looks == [False, True]
    first, again = ran
    assert [p.repeat for p in again] == [p.repeat + spec.repeats for p in first]
    assert not {p.point_id for p in first} & {p.point_id for p in again}
    assert [p.config for p in again] == [p.config for p in first]
    assert "runs once more" in capsys.readouterr().err


def test_a_sweep_names_the_runs_that_were_not_faithful(capsys):
    from testbed.sweep import runner

    table = pd.DataFrame({"strategy": ["ring", "ring", "mapreduce"], "workers": [2, 8, 2],
                          "repeat": [0, 0, 0], "emulation_faithful": [True, False, None]})
    runner._warn_unfaithful(table)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1 of 3 runs were not faithful (ring N=8 #0)" in err
    runner._warn_unfaithful(table.assign(foreign_cpu_share=[0.0, 0.4, None]))
    assert "(ring N=8 #0, 1 of them while other processes used 25% of the CPUs or more" in capsys.readouterr().err
    runner._warn_unfaithful(table.assign(emulation_faithful=True))
    runner._warn_unfaithful(table.drop(columns="emulation_faithful"))  # a real network
    assert capsys.readouterr().err == ""
