"""Calibration files: the alpha-beta fit against a literal line, the file's refusals, which path
each strategy's messages take, and the network benchmark's option checks."""

from __future__ import annotations

import json

import pytest

from testbed.config import ConfigError, RunConfig
from testbed.config.calibration import KIND, Link, calibration_doc, fit, load_calibration
from testbed.strategies.registry import SPECS


def test_fit_recovers_a_line_and_refuses_what_no_network_does():
    sizes = [4096, 262144, 4194304]
    got = fit(sizes, [50e-6 + s / 2e9 for s in sizes])
    assert got.alpha_s == pytest.approx(50e-6) and got.bandwidth_Bps == pytest.approx(2e9)
    noisy = fit([1000, 2000, 3000, 4000], [1.0, 2.2, 2.8, 4.0])  # least squares, not two points
    assert 1 / noisy.bandwidth_Bps == pytest.approx(0.00096) and noisy.alpha_s == pytest.approx(0.1)
    with pytest.raises(ValueError, match="do not fit alpha"):
        fit([1000, 2000], [2e-3, 1e-3])  # bigger messages faster
    with pytest.raises(ValueError, match="do not fit alpha"):
        fit([1000, 2000], [1e-6, 10e-6])  # a negative latency
    with pytest.raises(ValueError, match="two sizes"):
        fit([1000, 1000], [1e-3, 1e-3])


def _write(tmp_path, paths, **over):
    doc = {**calibration_doc(paths, "same node", {"cpu_count": 2}, "2026-01-01T00:00:00Z"), **over}
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_file_round_trips_and_names_its_paths(tmp_path):
    path = _write(tmp_path, {"channel": {"alpha_s": 5e-5, "bandwidth_Bps": 4e9},
                             "call": {"alpha_s": 2e-3, "bandwidth_Bps": 1e9}})
    cal = load_calibration(path)
    assert cal.links == {"channel": Link(5e-5, 4e9), "call": Link(2e-3, 1e9)}
    assert cal.link("call", across=False) == (
        Link(2e-3, 1e9), f"calibration {path} (call: alpha 2000 us, 1 GB/s, same node)")
    link, said = cal.link("call", across=True)  # no inter-node measurement: said so
    assert link == Link(2e-3, 1e9) and "no inter-node fit" in said


def test_a_run_across_nodes_takes_the_inter_node_link(tmp_path):
    same = {"channel": {"alpha_s": 5e-5, "bandwidth_Bps": 4e9}}
    doc = calibration_doc(same, "same node", {}, "2026-01-01T00:00:00Z",
                          inter_node=({"channel": {"alpha_s": 1e-3, "bandwidth_Bps": 1e8}},
                                      "across nodes 10.0.0.1 and 10.0.0.2"))
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(doc))
    cal = load_calibration(str(path))
    assert cal.link("channel", across=False)[0] == Link(5e-5, 4e9)
    link, said = cal.link("channel", across=True)
    assert link == Link(1e-3, 1e8) and said.endswith("across nodes 10.0.0.1 and 10.0.0.2)")
    doc["inter_node"]["paths"]["channel"]["bandwidth_Bps"] = -1
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="bandwidth > 0"):
        load_calibration(str(path))


def test_a_path_fitted_only_across_nodes_predicts_a_run_that_spans_them(tmp_path):
    """Same-node times that fit no line leave the path out of `paths`; its inter-node fit still
    gives a run across nodes its model, and a run on one node says which fit is missing."""
    from dataclasses import replace

    from testbed.analysis.predict import network_link

    doc = calibration_doc({}, "same node", {}, "2026-01-01T00:00:00Z",
                          inter_node=({"call": {"alpha_s": 1e-3, "bandwidth_Bps": 1e8}}, "across nodes a and b"))
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(doc))
    cfg = RunConfig(strategy="ps-sync")
    cfg = replace(cfg, network=replace(cfg.network, calibration=str(path)))
    spec = SPECS["ps-sync"]
    (latency, bandwidth), said = network_link(spec, cfg, nodes=3)
    assert (latency, bandwidth) == (1e-3, 1e8) and said.endswith("across nodes a and b)")
    missing = network_link(spec, cfg, nodes=1)
    assert isinstance(missing, str) and "no fit of the 'call' path on one node" in missing
    assert "call across nodes" in missing


@pytest.mark.parametrize(("paths", "over", "needle"), [
    ({"call": {"alpha_s": 1e-3, "bandwidth_Bps": 1e9}}, {"kind": "other"}, "not a calibration file"),
    ({"call": {"alpha_s": 1e-3, "bandwidth_Bps": 1e9}}, {"schema_version": 9}, "not a calibration file"),
    ({}, {}, "holds no fitted path"),
    ({"call": {"alpha_s": 1e-3}}, {}, "no numeric alpha_s and bandwidth_Bps"),
    ({"wire": {"alpha_s": 1e-3, "bandwidth_Bps": 1e9}}, {}, "expected one of channel, call, torch"),
    ({"call": {"alpha_s": 1e-3, "bandwidth_Bps": 0}}, {}, "bandwidth > 0"),
])
def test_a_bad_file_is_refused_with_how_to_measure_one(tmp_path, paths, over, needle):
    with pytest.raises(ValueError, match=needle):
        load_calibration(_write(tmp_path, paths, **over))
    assert KIND == "testbed-calibration"


def test_each_strategy_names_the_path_its_messages_take():
    def path(strategy, **ring):
        cfg = RunConfig(strategy=strategy)
        if ring:
            from dataclasses import replace
            cfg = replace(cfg, ring=replace(cfg.ring, **ring))
        return SPECS[strategy].message_path(cfg)

    assert path("ring") == "channel"
    assert path("ring", transport="torch") == "torch"
    assert path("ring", algorithm="halving-doubling") == "call"
    assert {path(s) for s in ("ps-sync", "ps-async", "mapreduce", "gossip")} == {"call"}


@pytest.mark.parametrize(("argv", "needle"), [
    (["network", "--sizes", "4KiB"], "two sizes or more"),
    (["network", "--sizes", "4KiB,6B"], "multiple of 4 bytes"),
    (["network", "--paths", "channel,wire"], "'wire': choose among channel, call, torch"),
    (["network", "--repeats", "2"], "use 3 or more"),
    (["network", "--out", "/no/such/folder/cal.json"], "existing folder"),
])
def test_network_benchmark_options_are_checked_before_ray(argv, needle):
    from testbed.bench.cli import parse_args

    with pytest.raises(ConfigError, match=needle):
        parse_args(argv)
    ns = parse_args(["network", "--sizes", "1MiB,4KiB,4KiB", "--paths", "call,channel,call"])
    assert ns.sizes == [4096, 2**20] and ns.paths == ["call", "channel"]
