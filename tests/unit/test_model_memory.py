"""A real model's memory is counted from its flags before Ray starts (testbed.workloads.footprint):
one worker process that cannot hold its parameters, gradient and optimizer state is refused with
the numbers and the fix, exit 2 (before: `--d-model 65536` started Ray and a worker died asking
torch for 48 GiB: a traceback, exit 1)."""

import pytest

from testbed.config import ConfigError, parse_config
from testbed.runtime.cluster import plan_resources
from testbed.strategies.registry import SPECS
from testbed.workloads import footprint
from tests.unit.test_cli_errors import run_cli
from tests.unit.test_data_validation import cifar, mnist

GIB = 2**30

MODELS = [
    ["--workload", "transformer", "--d-model", "48", "--layers", "3", "--heads", "4", "--seq-len", "20"],
    ["--workload", "resnet", "--width", "8", "--depth", "2", "--classes", "7"],
    ["--workload", "mlp", "--features", "13", "--hidden", "9", "--classes", "3"],
    ["--workload", "logreg", "--features", "11", "--classes", "5"],
]


@pytest.mark.parametrize("argv", MODELS, ids=lambda a: a[1])
def test_the_count_is_the_built_models(argv):
    pytest.importorskip("torch")
    from testbed.workloads import make_workload

    w = parse_config(argv, SPECS).workload
    assert footprint.parameters(w) == make_workload(w, seed=0, workers=1).get_params().size


@pytest.mark.parametrize("kind", ["cifar", "mnist"])
def test_the_count_follows_the_data(tmp_path, kind):
    pytest.importorskip("torch")
    from testbed.workloads import make_workload

    folder = cifar(tmp_path) if kind == "cifar" else mnist(tmp_path)
    for name in ("resnet", "mlp", "logreg"):
        w = parse_config(["--workload", name, "--data", str(folder)], SPECS).workload
        assert footprint.parameters(w) == make_workload(w, seed=0, workers=1).get_params().size


def test_bytes_count_parameters_gradient_optimizer_and_a_transit_copy():
    w = parse_config(["--workload", "transformer"], SPECS).workload
    n = footprint.parameters(w)
    assert footprint.worker_bytes(w) == 4 * n * 3
    adam = parse_config(["--workload", "transformer", "--optimizer", "adam"], SPECS).workload
    assert footprint.worker_bytes(adam) == 4 * n * 5
    assert footprint.worker_bytes(parse_config(["--workload", "synthetic"], SPECS).workload) == 0


def test_a_model_no_process_can_hold_names_its_flags_and_the_numbers():
    w = parse_config(["--workload", "transformer", "--d-model", "65536", "--heads", "1"], SPECS).workload
    with pytest.raises(ConfigError) as info:
        footprint.check_fits(w, 1, 64 * GIB, 300 * 2**20)
    msg = str(info.value)
    assert msg.startswith("--workload transformer --d-model 65536 --layers 2: 103 G parameters")
    assert "1152.1 GiB per worker process" in msg and "64.0 GiB" in msg and "smaller --d-model or --layers" in msg


def test_the_model_counts_in_how_many_workers_fit():
    base = dict(workers=8, servers=0, total_cpus=2, total_gpus=0, total_memory=16 * GIB, device="cpu",
                cpus_per_worker=None, torch_workers=True)
    plan_resources(**base)
    with pytest.raises(ConfigError, match=r"--workers 8: 8 actor processes need about 18\.3 GiB .* at most 6 workers"):
        plan_resources(**base, model_bytes=2 * GIB)


def test_the_cli_refuses_before_ray(tmp_path):
    code, out, err, _ = run_cli(["--workload", "transformer", "--d-model", "65536", "--heads", "1",
                                 "--out", str(tmp_path / "runs")], tmp_path)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "--d-model 65536" in err and "GiB per worker process" in err
    assert not (tmp_path / "runs").exists()
