"""A run's CPU accounting (testbed.util.machine): this process's tree counts what its children
used, reaped ones included, and `CpuWindow` counts another process's work as foreign. Each
check compares with the CPU the busy process itself reports, as a lower bound: other load on
the machine only adds to foreign, never to the tree."""

import os
import subprocess
import sys
import time

import pytest

from testbed.session.autodilate import busy_note
from testbed.util.machine import BUSY_SHARE, CpuWindow, processes_below, tree_cpu_s
from tests.outside import left_behind

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads Linux /proc")

# Linux counts a process's CPU and a CPU's busy time separately, each in clock ticks: the two
# readings of a window differ by a few ticks a process
TICKS = 5 / os.sysconf("SC_CLK_TCK")
BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\nprint(time.process_time())"


def test_the_tree_counts_a_child_it_reaped():
    before = tree_cpu_s(os.getpid())
    used = float(subprocess.run([sys.executable, "-c", BUSY], capture_output=True, text=True, check=True).stdout)
    after = tree_cpu_s(os.getpid())
    assert before is not None and after is not None
    assert after[0] - before[0] >= used - TICKS


def test_a_process_outside_the_tree_is_foreign(tmp_path):
    """A busy loop outside this process's tree (tests.outside): what it used is in the window's
    foreign share."""
    done = tmp_path / "used"
    script = BUSY + f"\nopen({str(done)!r} + '.tmp', 'w').write(str(time.process_time()))" \
                    f"\nimport os; os.replace({str(done)!r} + '.tmp', {str(done)!r})"
    window = CpuWindow(ray=False)
    assert not set(left_behind(script)) & set(processes_below(os.getpid()))
    while not done.exists():  # the loop ends by itself once it has used its 0.4 s of CPU
        time.sleep(0.02)
    shares = window.shares()
    capacity = window.capacity_s
    assert shares["foreign_cpu_share"] * capacity >= float(done.read_text()) - TICKS
    assert 0 <= shares["machine_cpu_busy"] <= 1 + TICKS / capacity


def test_attached_to_another_ray_the_foreign_share_is_unknown():
    """Without a raylet below this process, Ray's workers would count as foreign: not said. (A
    test process that started a Ray of its own earlier has one below it: then it is said.)"""
    shares = CpuWindow().shares()
    assert (shares["foreign_cpu_share"] is None) == (not tree_cpu_s(os.getpid())[1])
    assert shares["machine_cpu_busy"] is not None


def test_the_search_says_when_other_processes_were_busy():
    quiet = [{"foreign_cpu_share": 0.05}, {"foreign_cpu_share": None}]
    assert busy_note(quiet) == "" and busy_note([]) == ""
    busy = [*quiet, {"foreign_cpu_share": BUSY_SHARE + 0.2}]
    assert f"up to {BUSY_SHARE + 0.2:.0%}" in busy_note(busy)


def test_the_printed_line_names_a_busy_machine_and_an_unknown_share():
    from testbed.run import machine_line

    assert machine_line({"machine_cpu_busy": 0.5, "foreign_cpu_share": 0.02}) == "50%  (2% by other processes)"
    assert "BUSY" in machine_line({"machine_cpu_busy": 0.9, "foreign_cpu_share": BUSY_SHARE})
    assert "unknown" in machine_line({"machine_cpu_busy": 0.5, "foreign_cpu_share": None})
