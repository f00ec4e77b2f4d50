"""Workers on GPUs, planned before Ray starts: who may share one GPU, and the one-line refusal
for those who may not (NCCL's ranks need a GPU each; tests/ray/test_gpu.py checks NCCL's own
refusal on a GPU machine)."""

import pytest

from testbed.config import ConfigError
from testbed.strategies.registry import SPECS
from tests.ray.helpers import make_config

GIB = 2**30
EXCLUSIVE = "NCCL refuses two ranks on one GPU"


def plan(**kw):
    from testbed.runtime.cluster import plan_resources

    base = dict(workers=2, servers=0, total_cpus=16, total_gpus=1, total_memory=64 * GIB, device="cuda",
                cpus_per_worker=None, torch_workers=True)
    return plan_resources(**{**base, **kw})


def test_workers_that_may_share_a_gpu_get_a_fraction_of_it():
    p = plan(workers=4, gpu_exclusive=None)
    assert p.device == "cuda" and p.gpus_per_worker == pytest.approx(0.25)


def test_workers_that_need_a_gpu_each_are_refused_beyond_the_gpus_with_the_reason_and_the_fix():
    with pytest.raises(ConfigError) as exc:
        plan(workers=2, gpu_exclusive=EXCLUSIVE)
    line = str(exc.value)
    assert "\n" not in line and "--workers 2" in line and EXCLUSIVE in line and "at most 1 workers" in line


def test_workers_that_need_a_gpu_each_get_a_whole_one_where_there_are_enough():
    p = plan(workers=2, total_gpus=2, gpu_exclusive=EXCLUSIVE)
    assert p.gpus_per_worker == pytest.approx(1.0)


def test_on_the_cpu_the_gpu_rule_does_not_apply():
    p = plan(workers=4, total_gpus=0, device="auto", gpu_exclusive=EXCLUSIVE)
    assert p.device == "cpu" and p.gpus_per_worker == 0


@pytest.mark.parametrize(("strategy", "extra", "exclusive"), [
    ("allreduce-torch", {}, True),
    ("ring", {"ring.transport": "torch"}, True),
    ("ring", {"ring.transport": "object-store"}, False),
    ("ring", {"ring.algorithm": "tree"}, False),
    ("ps-sync", {}, False),
    ("ps-async", {}, False),
    ("mapreduce", {}, False),
    ("gossip", {}, False),
])
def test_each_strategy_says_whether_its_workers_may_share_a_gpu(strategy, extra, exclusive):
    cfg = make_config(strategy=strategy, workers=2, **extra)
    why = SPECS[strategy].cannot_share_gpu(cfg)
    assert (why is not None) == exclusive
    if why:
        assert "use " in why  # the fix


# The command as a user runs it, on a machine that reports one GPU (the test machine may have
# none): it must stop at the plan, before Ray starts and before a results folder exists.
ONE_GPU = """
import sys
import testbed.runtime.cluster as c
c.local_machine = lambda: {"CPU": 16.0, "GPU": 1.0, "memory": 64.0 * 2**30}
from testbed import run
code = run.main(sys.argv[1:])
import ray
assert not ray.is_initialized(), "Ray started"
raise SystemExit(code)
"""


@pytest.mark.parametrize("argv", [
    ["--strategy", "allreduce-torch", "--workers", "2", "--device", "cuda"],
    ["--strategy", "ring", "--transport", "torch", "--workers", "3", "--device", "auto"],
])
def test_the_command_refuses_nccl_ranks_sharing_a_gpu_before_ray_starts(argv, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-c", ONE_GPU, *argv, "--steps", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(err) == 1 and "NCCL" in err[0] and "at most 1 workers" in err[0], err
    assert not out.exists()
