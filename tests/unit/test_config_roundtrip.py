"""Tests for testbed.config: a config survives to_dict/from_dict and with_overrides, and
parse_config maps every part of the command line (the rules: test_config.py)."""

import json
from dataclasses import replace

import pytest

from testbed.config import (
    ConfigError,
    NetworkConfig,
    RunConfig,
    WorkloadConfig,
    from_dict,
    parse_config,
    validate,
    with_overrides,
)
from testbed.ps.config import PSConfig
from testbed.strategies.registry import SPECS

# ---------------------------------------------------------------- round trips


def _busy_config(tmp_path):
    return RunConfig(
        strategy="ps-async", workers=6, steps=7, seed=3, out=str(tmp_path), quiet=True,
        timeline=True, straggler="fixed:worker=2,delay=5ms",
        workload=WorkloadConfig(name="synthetic", batch_size=8, lr=0.05, grad_mb=1.5,
                                compute_ms=2.0, payload="scaled:0.25"),
        ps=PSConfig(shards=3, staleness_bound=2),
        network=NetworkConfig(bandwidth="10Gbit", latency="50us"),
    )


def test_from_dict_round_trips_to_dict(tmp_path):
    cfg = _busy_config(tmp_path)
    assert from_dict(cfg.to_dict()) == cfg
    assert from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg  # as saved in config.json
    assert from_dict(RunConfig().to_dict()) == RunConfig()
    validate(from_dict(cfg.to_dict()), SPECS)


def test_from_dict_ignores_unknown_top_level_keys():
    data = {**RunConfig(workers=3).to_dict(), "schema_version": 1, "provenance": {}}
    assert from_dict(data) == RunConfig(workers=3)


def test_to_dict_is_nested_and_json_ready(tmp_path):
    d = _busy_config(tmp_path).to_dict()
    assert d["ps"] == {"shards": 3, "staleness_bound": 2, "backup_workers": 0, "servers": None,
                       "placement": "dedicated", "partition_mb": 4.0}
    assert d["workload"]["payload"] == "scaled:0.25"
    json.dumps(d, allow_nan=False)


def test_with_overrides_flat_and_dotted():
    cfg = RunConfig()
    new = with_overrides(cfg, workers=8, **{"ps.shards": 2, "workload.lr": 0.5,
                                            "network.bandwidth": "1Gbit"})
    assert (new.workers, new.ps.shards, new.workload.lr, new.network.bandwidth) == (8, 2, 0.5, "1Gbit")
    assert new.ps.staleness_bound is None and new.workload.name == "mlp"  # siblings kept
    assert cfg == RunConfig()  # the original is untouched
    assert with_overrides(cfg) == cfg


def test_with_overrides_rejects_unknown_fields():
    with pytest.raises(TypeError):
        with_overrides(RunConfig(), nope=1)
    with pytest.raises(TypeError):
        with_overrides(RunConfig(), **{"ps.nope": 1})


def test_derived_properties():
    cfg = RunConfig(workload=WorkloadConfig(name="synthetic", grad_mb=2.0, payload="scaled:0.01"),
                    network=NetworkConfig(bandwidth="10Gbit", latency="50us"))
    assert cfg.grad_bytes_logical == 2 * 2**20
    assert cfg.workload.payload.scale == 0.01
    assert WorkloadConfig().payload.scale == 1.0
    assert cfg.network.emulated and cfg.network.bandwidth_Bps == pytest.approx(1.25e9)
    assert cfg.network.latency_s == pytest.approx(50e-6)
    assert RunConfig().grad_bytes_logical is None
    assert not RunConfig().network.emulated and RunConfig().network.bandwidth_Bps is None


# ---------------------------------------------------------------- parse_config (argv)


def test_parse_config_defaults_equal_the_dataclass_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # default --out is relative
    # but for the automatic choices, made by validation: --workers-per-process (1 at the default
    # 8 workers), --real-workers (all of them) and --dilation (1 on the real network)
    auto = RunConfig()
    assert parse_config([], SPECS) == replace(auto, cluster=replace(auto.cluster, workers_per_process=1,
                                                                    real_workers=auto.workers),
                                              network=replace(auto.network, dilation=1.0))


def test_parse_config_maps_every_part(tmp_path):
    argv = ["--strategy", "ps-async", "--workers", "6", "--steps", "7", "--seed", "3",
            "--out", str(tmp_path), "--quiet", "--timeline",
            "--straggler", "fixed:worker=2,delay=5ms", "--workload", "synthetic",
            "--batch-size", "8", "--lr", "0.05", "--grad-mb", "1.5", "--compute-ms", "2",
            "--payload", "scaled:0.25", "--ps-shards", "3", "--staleness-bound", "2",
            "--bandwidth", "10Gbit", "--latency", "50us"]
    assert parse_config(argv, SPECS) == validate(_busy_config(tmp_path), SPECS)


def test_parse_config_ring_and_cluster_flags(tmp_path):
    cfg = parse_config(["--no-overlap", "--bucket-mb", "4", "--transport", "torch",
                        "--placement", "spread", "--device", "cpu", "--cpus-per-worker", "0.5",
                        "--timeout", "5", "--address", "auto", "--out", str(tmp_path)], SPECS)
    assert cfg.ring.overlap is False and cfg.ring.bucket_mb == 4.0
    assert cfg.ring.transport == "torch"
    assert (cfg.cluster.placement, cfg.cluster.device, cfg.cluster.cpus_per_worker,
            cfg.cluster.timeout_s, cfg.cluster.address) == ("spread", "cpu", 0.5, 5.0, "auto")
    assert parse_config(["--overlap", "--out", str(tmp_path)], SPECS).ring.overlap is True


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--workers", "abc"], "'abc'"),
        (["--lr", "fast"], "'fast'"),
        (["--no-such-flag"], "--no-such-flag"),
        (["--workers"], "--workers"),
        (["--workers", "0"], "--workers 0"),
        (["--lr", "nan"], "--lr nan"),
    ],
)
def test_parse_config_bad_argv_raises_config_error(tmp_path, argv, needle):
    with pytest.raises(ConfigError) as info:
        parse_config([*argv, "--out", str(tmp_path)], SPECS)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_the_factor_a_run_goes_at_is_a_number_once_resolved():
    """Validation resolves a left-out --dilation; a config built in code and never validated
    runs undilated; auto has no factor until the session's search puts one in its place."""
    assert RunConfig().network.factor == 1.0
    emulated = {"network.bandwidth": "1Gbit", "workload.name": "synthetic"}
    assert validate(with_overrides(RunConfig(), **emulated), SPECS).network.dilation == "auto"
    with pytest.raises(ValueError, match="resolved by the session"):
        _ = validate(with_overrides(RunConfig(), **emulated), SPECS).network.factor
    cfg = validate(with_overrides(RunConfig(), **emulated, **{"network.dilation": 4.0}), SPECS)
    assert cfg.network.factor == 4.0 and cfg.network.wire == (1e9 / 8 / 4, 0.0)
