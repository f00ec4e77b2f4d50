"""The reaper a command leaves behind when it exits without stopping Ray in order
(`testbed.runtime.reaper.end_ray_processes_after_exit`): it ends the processes it was given once
their parent is gone, and not before. Plain processes stand in for Ray's."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from testbed.runtime.reaper import pid_alive


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def test_the_reaper_waits_for_the_parent_then_ends_the_processes():
    parent, child = _sleeper(), _sleeper()
    reaper = subprocess.Popen([sys.executable, "-m", "testbed.runtime.reaper", str(parent.pid), str(child.pid)])
    try:
        time.sleep(0.5)  # the reaper is up (or still starting): either way the parent lives, so
        assert reaper.poll() is None and child.poll() is None  # nothing has been ended yet
        parent.kill()
        parent.wait()
        assert reaper.wait(timeout=60) == 0
        assert child.wait(timeout=10) == -signal.SIGTERM and not pid_alive(child.pid)
    finally:
        for proc in (parent, child, reaper):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
