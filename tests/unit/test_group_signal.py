"""A signal to the run's whole process group (`kill -TERM -- -PGID`, a batch scheduler) ends the
run as one to the process alone does: Ray stopped in order, the ring's semaphores removed, no
process of the run left (before: Ray's daemons shared the group, the raylet took the signal and
spent about 10 s shutting itself down, the run gave up on Ray after 11.2 s and left 4-6
/dev/shm/sem.* files). Semaphores a killed run left are removed by the next run, by owner."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from testbed.runtime.reaper import release_orphaned_semaphores

WAIT_S = 180  # for Ray to start and the run to record its first updates on a busy machine


def descendants(pid):
    parent = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parent[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


def cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def started(pid):
    """The process's start time (clock ticks after boot): a pid reused later has another one."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def running(pid, start):
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] not in "ZX" and fields[19] == start


@pytest.mark.skipif(not Path("/dev/shm").is_dir() or sys.platform != "linux", reason="Linux /dev/shm")
def test_sigterm_to_the_group_stops_ray_in_order(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen([sys.executable, "-m", "testbed.run", "--strategy", "ring", "--workers", "2",
                             "--steps", "100000", "--quiet", "--out", str(tmp_path)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and proc.poll() is None:  # the first records: the ring is up
            logs = list(tmp_path.glob("*/records.jsonl"))
            if logs and len(logs[0].read_text().splitlines()) > 3:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        ours = {p: started(p) for p in descendants(proc.pid)}
        raylets = [p for p in ours if "raylet" in cmdline(p)]
        assert raylets and os.getpgid(raylets[0]) != proc.pid  # Ray's daemons are out of the group
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this test started
            proc.communicate()
    assert proc.returncode == 130, err
    summary = json.loads(next(tmp_path.glob("*/summary.json")).read_text())
    assert summary["status"] == "interrupted" and summary["steps"] > 0
    # a process may still be in its exit (its memory gone, an empty cmdline) as the driver returns:
    # wait for each one's end; the bound only turns a process the run left behind into a failure
    deadline = time.monotonic() + WAIT_S
    while (left := {p: cmdline(p) for p, start in ours.items() if running(p, start)}) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == {}
    assert list(Path("/dev/shm").glob(f"sem.*{raylets[0]}-*")) == []


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
def test_semaphores_of_a_gone_raylet_are_removed_and_no_others():
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    tag = uuid.uuid4().int % 10**12
    gone = [Path(f"/dev/shm/sem.{kind}{pid_max + 1}-{tag}") for kind in ("hdr", "obj")]
    not_raylet = Path(f"/dev/shm/sem.hdr{os.getpid()}-{tag}")  # a live pid, but no raylet
    other = Path(f"/dev/shm/sem.mp-{tag}")  # not a raylet's name
    mapped = Path(f"/dev/shm/sem.obj{pid_max + 2}-{tag}")
    for path in (*gone, not_raylet, other, mapped):
        path.write_bytes(b"\0" * 32)
    try:
        import mmap

        with open(mapped, "r+b") as fh, mmap.mmap(fh.fileno(), 32):  # a live process maps it
            removed = release_orphaned_semaphores()
            assert mapped.exists()
        assert set(gone) | {not_raylet} <= set(removed)
        assert not any(p.exists() for p in (*gone, not_raylet)) and other.exists()
    finally:
        for path in (*gone, not_raylet, other, mapped):
            path.unlink(missing_ok=True)
