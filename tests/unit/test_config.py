"""Tests for testbed.config: every validate() rule (round trips and the argv mapping:
test_config_roundtrip.py).

Each rejected value must raise ConfigError whose one line names the flag and the value
("--flag <repr(value)>"), and a nearby good value must pass. The strategy -> family table is
literal, so these tests do not depend on which strategies are registered (or on Ray).
"""

import os
import stat
from dataclasses import replace

import pytest

from testbed.config import (
    ConfigError,
    RunConfig,
    validate,
    with_overrides,
)
from testbed.strategies.registry import SPECS

NAN, INF = float("nan"), float("inf")


@pytest.fixture
def base(tmp_path):
    """Default config writing under tmp_path, so --out never depends on the cwd."""
    return RunConfig(out=str(tmp_path / "runs"))


def rejects(make, flag, value):
    """Assert building (spec strings are parsed then) or validating the config MAKE returns fails
    with one line naming FLAG and VALUE; return the message."""
    with pytest.raises(ConfigError) as info:
        validate(make(), SPECS)
    msg = str(info.value)
    assert f"{flag} {value!r}" in msg, msg
    assert "\n" not in msg and msg.strip() == msg
    return msg


def passes(cfg):
    """Valid: returned as it is, but for the automatic choices (--workers-per-process,
    --real-workers, and
    --dilation left out: auto where the network is emulated and the compute synthetic, else 1),
    and validating the result again changes nothing."""
    out = validate(cfg, SPECS)
    k = out.cluster.workers_per_process
    assert isinstance(k, int) and k >= 1
    given = cfg.cluster.workers_per_process is not None
    d = cfg.network.dilation
    if d is None:
        d = "auto" if cfg.network.emulated and not cfg.workload.real_compute else 1.0
    assert out.network.dilation == d
    made = replace(cfg, network=replace(cfg.network, dilation=d))
    real = out.cluster.real_workers  # --real-workers auto made a count
    assert isinstance(real, int) and 1 <= real <= cfg.workers
    if cfg.cluster.real_workers in (None, "auto"):
        made = replace(made, cluster=replace(made.cluster, real_workers=real))
    assert out == (made if given else replace(made, cluster=replace(made.cluster, workers_per_process=k)))
    assert validate(out, SPECS) == out


# (rule id, overrides, flag, value named in the message)
# --workers-per-process 2 where it applies (testbed.runtime.hosting)
# a ring of 8 on an emulated network, where some workers may be emulated peers (testbed.emulation.peers)
EMULATED_RING = {"strategy": "ring", "workers": 8, "workload.name": "synthetic", "network.bandwidth": "10Gbit"}
HOSTED = {"strategy": "ps-sync", "workers": 4, "workload.name": "synthetic", "cluster.workers_per_process": 2}
BAD = [
    ("strategy-unknown", {"strategy": "nope"}, "--strategy", "nope"),
    ("workload-unknown", {"workload.name": "alexnet"}, "--workload", "alexnet"),
    ("device-unknown", {"cluster.device": "tpu"}, "--device", "tpu"),
    ("placement-unknown", {"cluster.placement": "scatter"}, "--placement", "scatter"),
    ("transport-unknown", {"ring.transport": "pigeon"}, "--transport", "pigeon"),
    ("workers-zero", {"workers": 0}, "--workers", 0),
    ("workers-negative", {"workers": -1}, "--workers", -1),
    ("workers-huge", {"workers": 100000}, "--workers", 100000),
    ("workers-just-over-max", {"workers": 4097}, "--workers", 4097),
    ("workers-bool", {"workers": True}, "--workers", True),
    ("workers-float", {"workers": 2.0}, "--workers", 2.0),
    ("steps-zero", {"steps": 0}, "--steps", 0),
    ("seed-negative", {"seed": -1}, "--seed", -1),
    ("seed-too-big", {"seed": 2**32}, "--seed", 2**32),
    ("batch-size-zero", {"workload.batch_size": 0}, "--batch-size", 0),
    ("lr-zero", {"workload.lr": 0.0}, "--lr", 0.0),
    ("lr-negative", {"workload.lr": -1.0}, "--lr", -1.0),
    ("lr-nan", {"workload.lr": NAN}, "--lr", NAN),
    ("lr-inf", {"workload.lr": INF}, "--lr", INF),
    ("lr-string", {"workload.lr": "0.1"}, "--lr", "0.1"),
    ("lr-bool", {"workload.lr": True}, "--lr", True),
    ("grad-mb-zero", {"workload.grad_mb": 0.0}, "--grad-mb", 0.0),
    ("grad-mb-nan", {"workload.grad_mb": NAN}, "--grad-mb", NAN),
    ("grad-mb-inf", {"workload.grad_mb": INF}, "--grad-mb", INF),
    ("grad-mb-huge", {"workload.grad_mb": 1e6}, "--grad-mb", 1e6),
    ("compute-ms-negative", {"workload.compute_ms": -1.0}, "--compute-ms", -1.0),
    ("compute-ms-nan", {"workload.compute_ms": NAN}, "--compute-ms", NAN),
    ("backward-frac-over-one", {"workload.backward_frac": 1.5}, "--backward-frac", 1.5),
    ("backward-frac-negative", {"workload.backward_frac": -0.1}, "--backward-frac", -0.1),
    ("payload-bad", {"workload.name": "synthetic", "workload.payload": "bad"}, "--payload", "bad"),
    ("payload-scaled-zero", {"workload.name": "synthetic", "workload.payload": "scaled:0"},
     "--payload", "scaled:0"),
    ("payload-scaled-two", {"workload.name": "synthetic", "workload.payload": "scaled:2"},
     "--payload", "scaled:2"),
    ("payload-scaled-nan", {"workload.name": "synthetic", "workload.payload": "scaled:nan"},
     "--payload", "scaled:nan"),
    ("payload-scaled-empty", {"workload.name": "synthetic", "workload.payload": "scaled:"},
     "--payload", "scaled:"),
    ("payload-non-synthetic", {"workload.name": "mlp", "workload.payload": "scaled:0.5"},
     "--payload", "scaled:0.5"),
    ("cpus-per-worker-zero", {"cluster.cpus_per_worker": 0.0}, "--cpus-per-worker", 0.0),
    ("timeout-zero", {"cluster.timeout_s": 0.0}, "--timeout", 0.0),
    ("timeout-inf", {"cluster.timeout_s": INF}, "--timeout", INF),
    ("address-blank", {"cluster.address": "  "}, "--address", "  "),
    ("ps-shards-zero", {"strategy": "ps-sync", "ps.shards": 0}, "--ps-shards", 0),
    ("ps-shards-huge", {"strategy": "ps-sync", "ps.shards": 1025}, "--ps-shards", 1025),
    ("staleness-negative", {"strategy": "ps-async", "ps.staleness_bound": -1},
     "--staleness-bound", -1),
    ("staleness-with-ps-sync", {"strategy": "ps-sync", "ps.staleness_bound": 2},
     "--staleness-bound", 2),
    ("backup-equals-workers", {"strategy": "ps-sync", "workers": 4, "ps.backup_workers": 4},
     "--backup-workers", 4),
    ("backup-over-workers", {"strategy": "ps-sync", "workers": 4, "ps.backup_workers": 9},
     "--backup-workers", 9),
    ("backup-negative", {"strategy": "ps-sync", "ps.backup_workers": -1}, "--backup-workers", -1),
    ("backup-with-ps-async", {"strategy": "ps-async", "ps.backup_workers": 1},
     "--backup-workers", 1),
    ("ps-shards-on-ring", {"strategy": "ring", "ps.shards": 2}, "--ps-shards", 2),
    ("ps-servers-contradicts-shards", {"strategy": "ps-sync", "ps.shards": 2, "ps.servers": 4},
     "--ps-servers", 4),
    ("ps-servers-zero", {"strategy": "ps-sync", "ps.servers": 0}, "--ps-servers", 0),
    ("ps-colocated-more-servers-than-workers", {"strategy": "ps-sync", "workers": 2, "ps.shards": 3,
                                                "ps.placement": "colocated"}, "--ps-placement", "colocated"),
    ("ps-placement-unknown", {"strategy": "ps-sync", "ps.placement": "rack"}, "--ps-placement", "rack"),
    ("ps-partition-negative", {"strategy": "ps-async", "ps.partition_mb": -1.0}, "--ps-partition-mb", -1.0),
    ("ps-partition-on-ring", {"strategy": "ring", "ps.partition_mb": 1.0}, "--ps-partition-mb", 1.0),
    ("ps-shards-zero-on-mapreduce", {"strategy": "mapreduce", "ps.shards": 0}, "--ps-shards", 0),
    ("staleness-on-mapreduce", {"strategy": "mapreduce", "ps.staleness_bound": 0},
     "--staleness-bound", 0),
    ("backup-on-allreduce-torch", {"strategy": "allreduce-torch", "ps.backup_workers": 1},
     "--backup-workers", 1),
    ("transport-torch-on-mapreduce", {"strategy": "mapreduce", "ring.transport": "torch"},
     "--transport", "torch"),
    ("transport-torch-on-ps", {"strategy": "ps-sync", "ring.transport": "torch"},
     "--transport", "torch"),
    ("transport-on-allreduce-torch", {"strategy": "allreduce-torch", "ring.transport": "torch"},
     "--transport", "torch"),
    ("bucket-mb-zero", {"ring.bucket_mb": 0.0}, "--bucket-mb", 0.0),
    ("bandwidth-zero", {"network.bandwidth": "0Gbit"}, "--bandwidth", "0Gbit"),
    ("bandwidth-unknown-unit", {"network.bandwidth": "10Gfoo"}, "--bandwidth", "10Gfoo"),
    ("bandwidth-no-unit", {"network.bandwidth": "10"}, "--bandwidth", "10"),
    ("bandwidth-nan", {"network.bandwidth": "nanGbit"}, "--bandwidth", "nanGbit"),
    ("latency-without-bandwidth", {"network.latency": "50us"}, "--latency", "50us"),
    ("latency-unknown-unit", {"network.bandwidth": "10Gbit", "network.latency": "5parsec"},
     "--latency", "5parsec"),
    ("latency-negative", {"network.bandwidth": "10Gbit", "network.latency": "-1ms"},
     "--latency", "-1ms"),
    ("straggler-worker-99", {"workers": 8, "straggler": "fixed:worker=99,delay=200ms"},
     "--straggler", "fixed:worker=99,delay=200ms"),
    ("straggler-worker-equals-n", {"workers": 8, "straggler": "slowdown:worker=8,factor=2"},
     "--straggler", "slowdown:worker=8,factor=2"),
    ("straggler-unknown-kind", {"straggler": "bogus:worker=1"}, "--straggler", "bogus:worker=1"),
    ("straggler-empty", {"straggler": ""}, "--straggler", ""),
    ("dilation-below-the-floor", {"network.bandwidth": "10Gbit", "workload.name": "synthetic",
                                  "network.dilation": 0.005}, "--dilation", 0.005),
    ("dilation-zero", {"network.bandwidth": "10Gbit", "workload.name": "synthetic",
                       "network.dilation": 0.0}, "--dilation", 0.0),
    ("dilation-without-network", {"workload.name": "synthetic", "network.dilation": 4.0},
     "--dilation", 4.0),
    ("dilation-of-real-compute", {"network.bandwidth": "10Gbit", "network.dilation": 4.0},
     "--dilation", 4.0),
    ("hosting-zero", {"cluster.workers_per_process": 0}, "--workers-per-process", 0),
    ("hosting-torch-transport", {**HOSTED, "strategy": "ring", "ring.transport": "torch"}, "--workers-per-process", 2),
    ("hosting-gossip", {**HOSTED, "strategy": "gossip"}, "--workers-per-process", 2),
    ("hosting-real-compute", {**HOSTED, "workload.name": "mlp"}, "--workers-per-process", 2),
    ("hosting-with-faults", {**HOSTED, "faults.fail": "worker=1,at=2"}, "--workers-per-process", 2),
    ("hosting-colocated", {**HOSTED, "ps.servers": 2, "ps.placement": "colocated"}, "--workers-per-process", 2),
    ("hosting-beyond-workers", {**HOSTED, "workers": 1}, "--workers-per-process", 2),
    ("real-workers-zero", {**EMULATED_RING, "cluster.real_workers": 0}, "--real-workers", 0),
    ("real-workers-text", {**EMULATED_RING, "cluster.real_workers": "many"}, "--real-workers", "many"),
    ("real-workers-above", {**EMULATED_RING, "cluster.real_workers": 9}, "--real-workers", 9),
    ("real-workers-real-network", {**EMULATED_RING, "network.bandwidth": None, "cluster.real_workers": 2},
     "--real-workers", 2),
    ("real-workers-ps-async-ssp", {**EMULATED_RING, "strategy": "ps-async", "ps.staleness_bound": 1,
                                  "cluster.real_workers": 2}, "--real-workers", 2),
    ("real-workers-ps-async-model", {**EMULATED_RING, "strategy": "ps-async", "workload.name": "mlp",
                                    "cluster.real_workers": 2}, "--real-workers", 2),
    ("real-workers-ps-colocated", {**EMULATED_RING, "strategy": "ps-sync", "ps.placement": "colocated",
                                   "cluster.real_workers": 2}, "--real-workers", 2),
    ("real-workers-ps-backup", {**EMULATED_RING, "strategy": "ps-sync", "ps.backup_workers": 1,
                                "cluster.real_workers": 2}, "--real-workers", 2),
    ("real-workers-mapreduce-fp16", {**EMULATED_RING, "strategy": "mapreduce", "compression": "fp16",
                                     "cluster.real_workers": 2}, "--real-workers", 2),
    ("real-workers-gossip-async", {**EMULATED_RING, "strategy": "gossip", "gossip.asynchronous": True,
                                   "cluster.real_workers": 2}, "--real-workers", 2),
    ("real-workers-torch", {**EMULATED_RING, "strategy": "allreduce-torch", "network.bandwidth": None,
                            "cluster.real_workers": 2}, "--real-workers", 2),
    ("real-workers-algorithm", {**EMULATED_RING, "ring.algorithm": "halving-doubling", "cluster.real_workers": 2},
     "--real-workers", 2),
    ("real-workers-fp16", {**EMULATED_RING, "compression": "fp16", "cluster.real_workers": 2}, "--real-workers", 2),
    ("real-workers-local-sgd-tree", {**EMULATED_RING, "strategy": "local-sgd", "ring.algorithm": "tree",
                                     "cluster.real_workers": 2}, "--real-workers", 2),
    ("real-workers-fail", {**EMULATED_RING, "faults.fail": "worker=0,at=2", "cluster.real_workers": 2},
     "--real-workers", 2),
    ("real-workers-hosting", {**EMULATED_RING, "cluster.real_workers": 2, "cluster.workers_per_process": 4},
     "--workers-per-process", 4),
    ("fidelity-budget-zero", {**EMULATED_RING, "network.fidelity_budget_s": 0.0}, "--fidelity-budget", 0.0),
    ("fidelity-budget-nan", {**EMULATED_RING, "network.fidelity_budget_s": float("nan")}, "--fidelity-budget",
     float("nan")),
]


@pytest.mark.parametrize(("overrides", "flag", "value"),
                         [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_rule_rejects_bad_value(base, overrides, flag, value):
    rejects(lambda: with_overrides(base, **overrides), flag, value)


# (rule id, overrides): the good side of each rule, including its boundaries.
GOOD = [
    ("defaults", {}),
    ("strategy-mapreduce", {"strategy": "mapreduce"}),
    ("strategy-allreduce-torch", {"strategy": "allreduce-torch"}),
    ("strategy-ps-sync", {"strategy": "ps-sync"}),
    ("strategy-ps-async", {"strategy": "ps-async"}),
    ("workload-logreg", {"workload.name": "logreg"}),
    ("device-cuda", {"cluster.device": "cuda"}),  # a missing GPU is a cluster check, later
    ("placement-spread", {"cluster.placement": "spread"}),
    ("transport-torch-on-ring", {"ring.transport": "torch"}),
    ("workers-one", {"workers": 1}),
    ("workers-max", {"workers": 4096}),
    ("steps-one", {"steps": 1}),
    ("seed-max", {"seed": 2**32 - 1}),
    ("batch-size-one", {"workload.batch_size": 1}),
    ("lr-tiny", {"workload.lr": 1e-6}),
    ("lr-int", {"workload.lr": 1}),
    ("grad-mb-small", {"workload.grad_mb": 0.001}),
    ("grad-mb-max", {"workload.grad_mb": 65536.0}),
    ("compute-ms-zero", {"workload.compute_ms": 0.0}),
    ("backward-frac-bounds", {"workload.backward_frac": 1.0}),
    ("payload-scaled-one", {"workload.name": "synthetic", "workload.payload": "scaled:1"}),
    ("payload-scaled-small", {"workload.name": "synthetic", "workload.payload": "scaled:0.01"}),
    ("payload-full-on-mlp", {"workload.name": "mlp", "workload.payload": "full"}),
    ("cpus-per-worker", {"cluster.cpus_per_worker": 0.25}),
    ("address-auto", {"cluster.address": "auto"}),
    ("ps-shards", {"strategy": "ps-sync", "ps.shards": 4}),
    ("staleness-zero-async", {"strategy": "ps-async", "ps.staleness_bound": 0}),
    ("backup-below-workers", {"strategy": "ps-sync", "workers": 4, "ps.backup_workers": 3}),
    ("bandwidth-bits", {"network.bandwidth": "10Gbit"}),
    ("bandwidth-bytes", {"network.bandwidth": "1.25GB/s"}),
    ("latency-with-bandwidth", {"network.bandwidth": "10Gbit", "network.latency": "50us"}),
    ("latency-zero-without-bandwidth", {"network.latency": "0"}),
    ("straggler-last-worker", {"workers": 8, "straggler": "fixed:worker=7,delay=200ms"}),
    ("straggler-random", {"straggler": "random:dist=exponential,mean=5ms"}),
    ("hosting-ps", HOSTED),
    ("hosting-ring", {**HOSTED, "strategy": "ring"}),
    ("hosting-mapreduce", {**HOSTED, "strategy": "mapreduce", "workers": 5, "cluster.workers_per_process": 5}),
    ("dilation-faster-than-real-time", {"network.bandwidth": "10Gbit", "workload.name": "synthetic",
                                        "network.dilation": 0.25}),
    ("real-workers-one", {**EMULATED_RING, "cluster.real_workers": 1}),
    ("real-workers-all", {**EMULATED_RING, "cluster.real_workers": 8}),
    ("real-workers-all-real-network", {**EMULATED_RING, "network.bandwidth": None, "cluster.real_workers": 8}),
    ("real-workers-auto", {**EMULATED_RING, "cluster.real_workers": "auto"}),
    ("real-workers-hosted", {**EMULATED_RING, "cluster.real_workers": 4, "cluster.workers_per_process": 2}),
    ("real-workers-ps-sync", {**EMULATED_RING, "strategy": "ps-sync", "ps.shards": 2, "cluster.real_workers": 2}),
    ("real-workers-mapreduce", {**EMULATED_RING, "strategy": "mapreduce", "cluster.real_workers": 3}),
    ("real-workers-gossip", {**EMULATED_RING, "strategy": "gossip", "cluster.real_workers": 3}),
]


@pytest.mark.parametrize("overrides", [g[1] for g in GOOD], ids=[g[0] for g in GOOD])
def test_rule_accepts_good_value(base, overrides):
    passes(with_overrides(base, **overrides))


def test_real_workers_auto_keeps_every_worker_real_up_to_16_and_plays_peers_beyond_where_it_can(base):
    def real(**changes):
        return validate(with_overrides(base, **{**EMULATED_RING, **changes}), SPECS).cluster.real_workers

    assert real(workers=16) == 16
    assert real(workers=17) == real(workers=32) == real(workers=1024) == 16
    assert real(workers=64, **{"network.bandwidth": None}) == 64  # no emulated network: all real
    assert real(workers=64, strategy="ps-sync") == real(workers=64, strategy="mapreduce") == 16
    assert real(workers=64, strategy="ps-async") == 16  # its peers' timelines: testbed.ps.async_peers
    assert real(workers=64, strategy="ps-async", **{"ps.staleness_bound": 1}) == 64  # SSP: all real
    assert real(workers=64, strategy="ps-async", **{"workload.name": "mlp"}) == 64  # a real model's compute
    assert real(workers=64, strategy="gossip") == 16
    assert real(workers=64, strategy="gossip", **{"gossip.asynchronous": True}) == 64
    assert real(workers=64, strategy="ps-sync", **{"ps.placement": "colocated"}) == 64
    assert real(workers=64, **{"faults.fail": "worker=0,at=2"}) == 64


def test_real_workers_auto_starts_fewer_where_their_calls_per_step_pass_the_budget(base):
    """ps-sync pushes and pulls each partition: a 1.2 GB gradient in 4 MiB partitions (300) is
    600 calls per worker and step, so 4 real workers make 2,400; 100 MiB (25 partitions) leaves
    16, and nothing goes below one real worker. Up to 16 workers every worker stays real."""
    from testbed.config.validate import AUTO_MESSAGES

    def real(**changes):
        return validate(with_overrides(base, **{**EMULATED_RING, "strategy": "ps-sync", "workers": 128,
                                                "workload.name": "synthetic", **changes}), SPECS).cluster.real_workers

    one = with_overrides(base, strategy="ps-sync", **{"workload.name": "synthetic", "workload.grad_mb": 1200.0})
    assert SPECS["ps-sync"].messages_per_step(one) == 600
    assert SPECS["ps-sync"].messages_per_step(base) is None  # a real model: its size is known once it is up
    assert real(**{"workload.grad_mb": 1200.0}) == AUTO_MESSAGES // 600 == 4
    assert real(**{"workload.grad_mb": 100.0}) == 16
    assert real(**{"workload.grad_mb": 1200.0, "ps.partition_mb": 0.5}) == 1  # 2,400 partitions
    assert real(workers=16, **{"workload.grad_mb": 1200.0}) == 16
    assert real(strategy="ring", **{"workload.grad_mb": 1200.0}) == 16  # the ring says no count


def test_strategy_error_lists_the_choices(base):
    msg = rejects(lambda: with_overrides(base, strategy="nope"), "--strategy", "nope")
    assert all(name in msg for name in SPECS)


def test_backup_workers_error_names_the_worker_count(base):
    cfg = with_overrides(base, strategy="ps-sync", workers=4, **{"ps.backup_workers": 4})
    assert "--workers (4)" in rejects(lambda: cfg, "--backup-workers", 4)


def test_straggler_error_names_the_valid_range(base):
    cfg = with_overrides(base, workers=8, straggler="fixed:worker=99,delay=200ms")
    assert "0..7" in rejects(lambda: cfg, "--straggler", "fixed:worker=99,delay=200ms")


# ---------------------------------------------------------------- --out


def test_out_that_is_a_file(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    rejects(lambda: RunConfig(out=str(f)), "--out", str(f))


def test_out_below_a_file(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    rejects(lambda: RunConfig(out=str(f / "runs")), "--out", str(f / "runs"))


def test_out_that_does_not_exist_yet(tmp_path):
    passes(RunConfig(out=str(tmp_path / "deep" / "new" / "runs")))
    assert not (tmp_path / "deep").exists()  # validation creates nothing


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="running as root: root can write to any folder, so an unwritable --out cannot be made",
)
def test_out_in_an_unwritable_folder(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        rejects(lambda: RunConfig(out=str(locked / "runs")), "--out", str(locked / "runs"))
    finally:
        locked.chmod(stat.S_IRWXU)
