"""Test tiers, the two halves the suite runs in, and the one Ray of each.

    tests/unit   no Ray (checked below), no cluster; seconds
    tests/ray    marked `ray`: one local Ray per test process, started on first use
    slow         the long end-to-end checks (sweeps, signals, hangs); `pytest -m "not slow"`
                 is the inner loop, plain `pytest` the full suite CI runs
    own_ray      runs the CLI in processes of its own, each with its own Ray (not the session's)
    gpu          needs a CUDA device; skipped with the reason otherwise

The suite runs in two processes (pytest-xdist, `-n 2 --dist loadgroup` in pyproject.toml): about
half of its time the cores sit idle while tests wait on emulated transfers, timeouts and
processes of their own, so two streams of tests fill them. The Ray tier is split by file into two
groups (`RAY_GROUPS`), each run whole by one process with a Ray of its own; the unit tests go to
whichever process is free, after the namespace cluster. `pytest -n 0` runs everything in one
process, in the same order.
"""

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


# The Ray tier's files in two groups. Group "b" holds the reliability batch, which starts with the
# group's first test, so "b" takes longer (2-core machine, both groups at once: b 210 s, a 190 s);
# the process that ends "a" first runs the namespace cluster (75 s) next, the other the unit tests.
RAY_GROUPS = {
    "a": ("test_algorithms", "test_bench", "test_channels", "test_cli", "test_compression_strategies",
          "test_convergence", "test_emulation", "test_equivalence", "test_fidelity", "test_gossip",
          "test_gpu", "test_hosting", "test_map", "test_plumbing", "test_fault_reach",
          "test_run_stderr"),
    "b": ("test_faults", "test_notebook", "test_pool", "test_ps",
          "test_regression", "test_reliability", "test_ring", "test_sweep"),
    # the ring across two raylets: with the namespace cluster, after the first group has ended (in
    # the middle of the suite its 300 KB message twice did not arrive within 60 s; not explained)
    "cluster": ("test_multinode",),
}
BATCH_GROUP = "b"


def ray_group(item) -> str | None:
    """The group of a tests/ray item ("ray-a", "ray-b", "cluster"), None for the other tiers."""
    path = Path(item.fspath)
    if HERE / "ray" not in path.parents:
        return None
    group = next((g for g, files in RAY_GROUPS.items() if path.stem in files), None)
    assert group is not None, f"{path.name} is in no group of tests/conftest.py RAY_GROUPS: add it to one"
    return group if group == "cluster" else f"ray-{group}"


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Mark the tiers and the groups; GPU tests skip with a reason when no CUDA device is present."""
    for item in items:
        group = ray_group(item)
        if group is not None:
            item.add_marker(pytest.mark.ray)
            item.add_marker(pytest.mark.xdist_group(group))
            if "own_ray" not in item.keywords:
                item.fixturenames.insert(0, "ray_up")  # every Ray test shares the session's Ray
        elif HERE / "cluster" in Path(item.fspath).parents:
            item.add_marker(pytest.mark.xdist_group("cluster"))
    # the two-node test takes its process's Ray down: run it late, so nothing has to start it
    # again; then the namespace cluster (not at the start, beside the reliability batch: that
    # slowed the cluster's start 3-fold), and the unit tests, which fill whatever time is left
    order = ("tests/ray/test_multinode.py", "tests/cluster/", "tests/unit/")
    items.sort(key=lambda item: next((i + 1 for i, p in enumerate(order) if item.nodeid.startswith(p)), 0))
    if not any("gpu" in item.keywords for item in items):
        return
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is present on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_setup(item):
    """Cases that mostly wait on processes of their own (test_reliability) start with the first
    test of their group, in the process that runs the group, and overlap the rest of it."""
    global _batch_looked
    if _batch_looked or ray_group(item) != f"ray-{BATCH_GROUP}":
        return
    _batch_looked = True
    if any(Path(i.fspath).name == "test_reliability.py" for i in item.session.items):
        import tempfile

        from tests.ray.test_reliability import Batch

        Batch.begin(Path(tempfile.mkdtemp(prefix="testbed-reliability-")))


_batch_looked = False  # the batch's group started in this process (and the batch with it, if collected)


def pytest_sessionfinish(session, exitstatus):
    """The unit tier must not import Ray: when only unit tests ran, Ray must not be loaded."""
    if "tests.ray.test_reliability" in sys.modules:
        sys.modules["tests.ray.test_reliability"].Batch.end()
    items = getattr(session, "items", [])
    if items and all(HERE / "unit" in Path(i.fspath).parents for i in items) and "ray" in sys.modules:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print("\ntests/unit imported Ray: the unit tier must run without it", file=sys.stderr)


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray for the session (dashboard off, token auth on, explicit CPUs), started by
    the same code a run uses. A test that needs another cluster shuts this one down and calls
    `restart_session_ray()` when it is done."""
    from testbed.runtime import pool
    from testbed.runtime.rayprocs import start_ray, stop_ray

    start_ray(None, num_cpus=SESSION_CPUS)
    pool.install(pool.ProcessPool())  # runs of the suite reuse worker processes (see pool.py)
    yield
    pool.install(None)
    stop_ray()


@pytest.fixture
def ray_up(ray_cluster):
    """The session's Ray, started again if a test before took it down (test_multinode)."""
    import ray

    if not ray.is_initialized():
        restart_session_ray()


# Logical CPUs of the session's Ray. Ray keeps as many idle worker processes warm as it has CPUs,
# and the suite creates and kills a few hundred actors: with 16, most start from a warm process
# started while other tests sleep (emulated transfers, timeouts). Each worker still gets a share
# of at most one CPU, as on the real machine, so thread counts and placement are what a run gets.
SESSION_CPUS = 16


def restart_session_ray():
    from testbed.runtime.rayprocs import start_ray

    start_ray(None, num_cpus=SESSION_CPUS)
