"""Test tiers and the one Ray of a test session.

    tests/unit   no Ray (checked below), no cluster; seconds
    tests/ray    marked `ray`: one local Ray for the whole session, started on first use
    slow         the long end-to-end checks (sweeps, signals, hangs); `pytest -m "not slow"`
                 is the inner loop, plain `pytest` the full suite CI runs
    own_ray      runs the CLI in processes of its own, each with its own Ray (not the session's)
    gpu          needs a CUDA device; skipped with the reason otherwise
"""

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """Mark the tiers; GPU tests skip with a reason when no CUDA device is present."""
    for item in items:
        if HERE / "ray" in Path(item.fspath).parents:
            item.add_marker(pytest.mark.ray)
            if "own_ray" not in item.keywords:
                item.fixturenames.insert(0, "ray_up")  # every Ray test shares the session's Ray
    # the two-node test takes the session's Ray down: run it late, so nothing has to start it
    # again; the namespace cluster last, alone on the machine (not beside the reliability batch,
    # which starts its processes when collection ends and would slow the cluster's start 3-fold)
    late = [item for item in items if item.nodeid.startswith("tests/ray/test_multinode.py")]
    last = [item for item in items if item.nodeid.startswith("tests/cluster/")]
    items[:] = [item for item in items if item not in late and item not in last] + late + last
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


def pytest_collection_finish(session):
    """Cases that mostly wait on processes of their own (test_reliability) start now, beside the
    rest of the suite, when any of them was collected."""
    if any(item.nodeid.startswith("tests/ray/test_reliability.py") for item in session.items):
        import tempfile

        from tests.ray.test_reliability import Batch

        Batch.begin(Path(tempfile.mkdtemp(prefix="testbed-reliability-")))


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
