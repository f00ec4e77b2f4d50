"""What outlives Ray: the processes of a Ray this process started (ended after its own
shutdown, or without it when it cannot be stopped in order), and the named semaphores raylets
leave in /dev/shm. `rayprocs.py` starts and stops Ray; this module cleans up after it.
"""

from __future__ import annotations

import os
import re
import sys
from contextlib import suppress
from pathlib import Path

RAY_PROCESS = ("raylet", "gcs_server", "default_worker.py", "ray::", "dashboard", "runtime_env",
               "log_monitor", "monitor.py")


def become_subreaper() -> None:
    """Linux: let the processes of the Ray this process starts stay its descendants even when
    their parent dies first (a signal to the process group takes the raylet, whose agents would
    otherwise be adopted by init and outlive the run by a minute), so `stop_ray` can end them."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def ray_descendants() -> dict[int, str]:
    """This process's descendants that are Ray's: {pid: command line}."""
    parent, cmd = {}, {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parent[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmd[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return {pid: cmd.get(pid, "") for pid in found if any(k in cmd.get(pid, "") for k in RAY_PROCESS)}


def end_processes(pids: dict[int, str], grace: float = 2.0) -> None:
    """What is left of them after Ray's own shutdown: SIGTERM, a moment, SIGKILL, and reap."""
    import signal
    import time

    left = [pid for pid in pids if pid_alive(pid)]
    for pid in left:
        with suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while (left := [pid for pid in left if pid_alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        with suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:  # adopted orphans are ours to reap (Ray's own children it reaps itself)
        with suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def end_ray_processes() -> None:
    """Ray cannot be stopped in order (its daemons are gone, or it would not stop in time): end
    the processes of it that this process started, before leaving without it."""
    end_processes(ray_descendants(), grace=1.0)


def end_ray_processes_after_exit() -> None:
    """end_ray_processes, by a process of its own once this one has exited (or 5 s later).

    For a process about to leave with a code of its own while ray.init may be connecting it:
    Ray's core worker in this process can end it with exit code 1 and nothing on stderr when its
    raylet dies (its "the local Raylet is dead" exit), so ending the raylet from here races this
    process's own last line and exit code. The reaper runs in a session of its own (a signal to
    this process's group does not stop it halfway)."""
    import subprocess

    pids = ray_descendants()
    if not pids:
        return
    subprocess.Popen([sys.executable, "-m", "testbed.runtime.reaper", str(os.getpid()), *map(str, pids)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True)


def _reap_after(parent: int, pids: list[int], wait_s: float = 5.0) -> None:
    """The reaper process: once `parent` is gone (at most `wait_s` later), end `pids`."""
    import time

    deadline = time.monotonic() + wait_s
    while pid_alive(parent) and time.monotonic() < deadline:
        time.sleep(0.02)
    end_processes(dict.fromkeys(pids, ""), grace=1.0)


def release_semaphores(raylets: list[int]) -> None:
    """Remove the named semaphores these (stopped) raylets left in /dev/shm."""
    for pid in raylets:
        for path in Path("/dev/shm").glob(f"sem.*{pid}-*"):
            if path.name.startswith((f"sem.hdr{pid}-", f"sem.obj{pid}-")):
                path.unlink(missing_ok=True)


SEMAPHORE = re.compile(r"sem\.(?:hdr|obj)(\d+)-\d+")  # a raylet's: its pid, then a number


def release_orphaned_semaphores(shm: Path = Path("/dev/shm")) -> list[Path]:
    """Remove the semaphores of raylets that are gone (a run killed with -9 left them): only
    files this user owns, named after a pid that is no running raylet, and mapped by no running
    process. Return what was removed."""
    try:
        ours = [p for p in shm.glob("sem.*") if SEMAPHORE.fullmatch(p.name) and p.stat().st_uid == os.getuid()]
    except OSError:
        return []
    gone = [p for p in ours if not is_raylet(int(SEMAPHORE.fullmatch(p.name).group(1)))]
    if not gone:
        return []
    mapped = mapped_shm()
    removed = []
    for path in gone:
        if path.name not in mapped:
            with suppress(OSError):
                path.unlink()
                removed.append(path)
    return removed


def is_raylet(pid: int) -> bool:
    try:
        return pid_alive(pid) and b"raylet" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def mapped_shm() -> set[str]:
    """Names of the /dev/shm files some process has mapped (those it can read: its own)."""
    names: set[str] = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with suppress(OSError):
                for line in (proc / "maps").read_text(errors="replace").splitlines():
                    at = line.find("/dev/shm/")
                    if at >= 0:
                        names.add(line[at + 9:].split(" ")[0])
    return names


def pid_alive(pid: int) -> bool:
    """Running (a dead daemon stays a zombie until its parent, this process, reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


if __name__ == "__main__":  # end_ray_processes_after_exit's reaper: PARENT PID...
    _reap_after(int(sys.argv[1]), [int(p) for p in sys.argv[2:]])
