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

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

# Bytecode caches on, as Python has them by default, where the environment turned them off
# (PYTHONDONTWRITEBYTECODE, set in some container images): the suite starts a few hundred
# processes (Ray's workers, the commands it runs as a user does) that import the same modules,
# and without caches each compiled testbed's sources (and pytest rewrote every test module) again.
# Set before pytest-xdist starts its processes and before any Ray, so all of them inherit it.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False


# The Ray tier's files in two groups. Group "b" holds the reliability batch, which starts with the
# group's first test and runs beside it (2-core machine, both groups at once: a 240 s, b 212 s);
# the process that ends its group first runs the namespace cluster (about 90 s) next, the other
# the unit tests, and both share the unit tests that are left.
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
    return _ray_group(Path(item.fspath))


def _ray_group(path: Path) -> str | None:
    if HERE / "ray" not in path.parents:
        return None
    group = next((g for g, files in RAY_GROUPS.items() if path.stem in files), None)
    assert group is not None, f"{path.name} is in no group of tests/conftest.py RAY_GROUPS: add it to one"
    return group if group == "cluster" else f"ray-{group}"


def xdist_group(path: Path) -> str | None:
    """The xdist group of the tests in a file: its Ray group, "cluster" for tests/cluster, else None."""
    return "cluster" if HERE / "cluster" in path.parents else _ray_group(path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup`, the groups read from the node ids' files. xdist tells the groups apart
    by the "@group" it appends to each item's node id, which pytest 9 no longer takes (node ids
    are built from `Item._id`, xdist sets `_nodeid`): every test was a group of its own, so both
    processes ran tests of both Ray groups, each with a Ray of its own, both started the
    reliability batch, and module fixtures (the regression sweep) were set up in both. Where
    xdist's suffix is there (pytest 8) it names the same groups."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    root = config.rootpath.resolve()

    class FileGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(root / nodeid.split("::", 1)[0]) or super()._split_scope(nodeid)

    return FileGroups(config, log)


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
        elif xdist_group(Path(item.fspath)) == "cluster":
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
    test of their group, in the process that runs the group, and overlap the rest of it. And the
    groups must hold: a process of `-n 2 --dist loadgroup` that runs tests of both Ray groups
    means the lanes broke (two Rays and two reliability batches in each process)."""
    global _batch_looked
    group = ray_group(item)
    if group in ("ray-a", "ray-b") and _lanes_apply(item.config):
        _ray_groups_run.add(group)
        if len(_ray_groups_run) > 1 and not _lanes_reported:
            _lanes_reported.append(item.nodeid)
            pytest.fail(f"this process ran tests of both Ray groups ({sorted(_ray_groups_run)}): xdist did "
                        "not keep the groups of tests/conftest.py RAY_GROUPS together (pytest_xdist_make_scheduler)")
    if _batch_looked or group != f"ray-{BATCH_GROUP}":
        return
    _batch_looked = True
    if any(Path(i.fspath).name == "test_reliability.py" for i in item.session.items):
        import tempfile

        from tests.ray.test_reliability import Batch

        Batch.begin(Path(tempfile.mkdtemp(prefix="testbed-reliability-")))


_batch_looked = False  # the batch's group started in this process (and the batch with it, if collected)
_ray_groups_run: set[str] = set()  # the Ray groups this process ran tests of
_lanes_reported: list[str] = []  # the test that said the groups broke (said once)


def _lanes_apply(config) -> bool:
    """An xdist worker of two or more that schedules by group: it runs at most one Ray group."""
    # (in a worker xdist sets --dist to "no" and `loadgroup` to whether it was "loadgroup")
    return (bool(getattr(config.option, "loadgroup", False))
            and int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1)


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
    pool.install(pool.ProcessPool(max_idle=POOL_IDLE))  # runs of the suite reuse worker processes (see pool.py)
    yield
    pool.install(None)
    stop_ray()


@pytest.fixture
def ray_up(ray_cluster):
    """The session's Ray, started again if a test before took it down (test_multinode)."""
    import ray

    if not ray.is_initialized():
        restart_session_ray()


# Idle worker processes the session's pool keeps (pool.MAX_IDLE is 16): an idle Ray actor process
# still costs about 0.75% of a core (Ray's own threads, 40 of them at 16 calls at once), so 16 idle
# in each of the two test processes held about a quarter of a core through the suite; runs of
# more workers than this start the rest afresh.
POOL_IDLE = 8

# Logical CPUs of the session's Ray. Ray keeps as many idle worker processes warm as it has CPUs,
# and the suite creates and kills a few hundred actors: with 16, most start from a warm process
# started while other tests sleep (emulated transfers, timeouts). Each worker still gets a share
# of at most one CPU, as on the real machine, so thread counts and placement are what a run gets.
SESSION_CPUS = 16


def restart_session_ray():
    from testbed.runtime.rayprocs import start_ray

    start_ray(None, num_cpus=SESSION_CPUS)
