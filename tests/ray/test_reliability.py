"""Nothing lost, nothing hangs: signals to the process or its group at any moment, kill -9, a
full disk, a Ray head already running, an address that is not Ray, a wrong token, Ray's own
messages, and /dev/shm. Each case runs the CLI in its own process, as a user would.

The cases mostly wait (on Ray starting, on a bounded shutdown, on Ray's retries), so they run at
the same time, a few at once (`cases`); each test then checks what its case saw. What a case
checks of its processes is tied to that run alone (the processes it started, the semaphores of
its own raylet), so the cases do not disturb each other's evidence.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from testbed.analysis.results import load_run
from testbed.session.execute import SHUTDOWN_INTERRUPTED_S, STARTUP_STUCK_S

pytestmark = [pytest.mark.slow, pytest.mark.own_ray]
ROOT = Path(__file__).resolve().parents[2]
RUN = [sys.executable, "-m", "testbed.run"]
LONG = ["--strategy", "ring", "--workers", "2", "--steps", "100000", "--workload", "synthetic",
        "--compute-ms", "20", "--grad-mb", "0.01", "--quiet"]


def descendants(root: int) -> set[int]:
    """Every process started, directly or not, by process `root` (its Ray daemons and workers)."""
    parent = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                parent[int(p.name)] = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if Path(f"/proc/{pid}").exists()
            and "zombie" not in Path(f"/proc/{pid}/status").read_text(errors="replace").lower()}


STARTED: list[subprocess.Popen] = []  # every process a case started (stopped at the end of the session)


def start(args, out, **kw) -> subprocess.Popen:
    proc = subprocess.Popen([*RUN, *args, "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)
    STARTED.append(proc)
    return proc


def wait_updates(out: Path, n: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = list(out.glob("*/records.jsonl"))
        if logs and logs[0].read_text().count('"kind": "update"') >= n:
            return
        time.sleep(0.2)
    pytest.fail(f"no {n} updates within {timeout} s")


def finish(proc: subprocess.Popen, timeout: float = 60, seen: set[int] | None = None) -> tuple[int, str, str]:
    """Wait for the process; meanwhile add every process it has started to `seen`."""
    deadline = time.monotonic() + timeout
    chunks: list[tuple[str, str]] = []
    reader = threading.Thread(target=lambda: chunks.append(proc.communicate()), daemon=True)
    reader.start()
    while reader.is_alive() and time.monotonic() < deadline:
        if seen is not None:
            seen |= descendants(proc.pid)
        reader.join(0.25)
    if reader.is_alive():
        os.killpg(proc.pid, signal.SIGKILL)
        reader.join()
        pytest.fail(f"still running {timeout} s after the signal")
    out, err = chunks[0]
    return proc.returncode, out, err


# (signal, to the whole process group, when: "run" after 5 updates or seconds after the command's
# first process (Ray's) appeared, twice)
SIGNALS = {
    "SIGTERM-group-run": (signal.SIGTERM, True, "run", False),      # a batch scheduler, kill -- -PGID
    "SIGINT-process-run-twice": (signal.SIGINT, False, "run", True),  # Ctrl-C, again a quarter second later
    # (SIGHUP, the terminal closing, takes the same handler: tests/unit/test_reliability.py)
    "SIGINT-group-start": (signal.SIGINT, True, 0.0, False),        # Ctrl-C as Ray starts
    "SIGTERM-process-start": (signal.SIGTERM, False, 1.0, False),   # kill PID while Ray starts
}


def wait_ray_starting(proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until the command has started its first process (Ray's: its imports are done, its handlers
    installed, ray.init under way). A clock from the launch marks no such moment: on a busy
    machine the command may still be importing, a case tests/unit/test_reliability.py covers."""
    deadline = time.monotonic() + timeout
    while not descendants(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not descendants(proc.pid):
        pytest.fail(f"the command started no process within {timeout} s (exit code {proc.poll()})")


def signal_case(root: Path, sig, group, when, twice) -> dict:
    proc = start(LONG, root)
    if when == "run":
        wait_updates(root, 5)
    else:
        wait_ray_starting(proc)
        time.sleep(when)
    send = os.killpg if group else os.kill
    started = descendants(proc.pid)
    t0 = time.monotonic()
    send(proc.pid, sig)
    if twice:
        time.sleep(0.25)
        send(proc.pid, sig)
    code, out, err = finish(proc, seen=started)
    took = time.monotonic() - t0
    left = leftovers(started)
    t0 = time.monotonic()  # the same command refused before it starts anything: this machine's pace now
    finish(start(["--workers", "0"], root), timeout=60)
    return {"code": code, "out": out, "err": err, "took": took, "left": left, "bare": time.monotonic() - t0}


def leftovers(pids: set[int], grace: float = 10.0) -> dict[int, str]:
    """The run's processes still alive after a few seconds' grace (for the last to exit), with
    their command lines."""
    deadline = time.monotonic() + grace
    while (left := alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.5)
    names = {}
    for pid in left:
        try:
            names[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:
            pass
    return names


def kill9_case(root: Path) -> dict:
    proc = start(LONG, root)
    wait_updates(root, 10)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    return {"run": load_run(next(root.iterdir()))}


def disk_case(root: Path, size: str) -> dict:
    disk = root / f"disk-{size}"
    disk.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return {"skip": f"cannot mount a small tmpfs here ({done.stderr.strip() or 'not root'}): "
                        "the disk-full case needs root"}
    try:
        code, out, err = finish(start(["--strategy", "ring", "--workers", "2", "--steps", "400",
                                       "--workload", "synthetic", "--quiet"], disk), timeout=120)
        folder = Path(out.strip().splitlines()[-1])
        return {"code": code, "err": err, "run": load_run(folder),
                "params": (folder / "params.npz").exists()}
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def head_case(root: Path) -> dict:
    """Beside a `ray start --head` of its own (own temp dir, so it is stopped without touching
    any other Ray on the machine): a plain run, then a run attached to it with a wrong token."""
    temp = Path("/tmp") / f"rh-{uuid.uuid4().hex[:6]}"  # short: Ray's socket paths are limited
    port = _free_port()
    done = subprocess.run(["ray", "start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
                           f"--temp-dir={temp}", "--disable-usage-stats"], capture_output=True, text=True,
                          timeout=120)
    try:
        assert done.returncode == 0, done.stderr
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        plain = finish(start(["--strategy", "ring", "--workers", "2", "--steps", "3", "--workload", "synthetic",
                              "--quiet"], root / "plain", env=env), timeout=120)
        env = {**os.environ, "RAY_AUTH_TOKEN": "not-the-token-of-that-cluster"}
        t0 = time.monotonic()
        wrong = finish(start(["--address", f"127.0.0.1:{port}", "--workers", "1", "--steps", "1", "--quiet"],
                             root / "attached", env=env), timeout=120)
        return {"plain": plain, "wrong": wrong, "wrong_took": time.monotonic() - t0}
    finally:
        for proc in Path("/proc").iterdir():  # every process of that head names its temp dir
            try:
                if proc.name.isdigit() and str(temp) in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    os.kill(int(proc.name), signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(temp, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def not_ray_case(root: Path) -> dict:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    held = []  # the accepted connection stays open: a listener that says nothing
    threading.Thread(target=lambda: held.append(server.accept()), daemon=True).start()
    t0 = time.monotonic()
    try:
        code, out, err = finish(start(["--address", f"127.0.0.1:{port}", "--quiet"], root), timeout=60)
    finally:
        server.close()
    took = time.monotonic() - t0
    t0 = time.monotonic()  # the same command refused before it looks anywhere: its start-up alone
    finish(start(["--workers", "0"], root), timeout=60)
    return {"code": code, "out": out, "err": err, "took": took, "bare": time.monotonic() - t0}


def main_command_case(root: Path) -> dict:
    seen: set[int] = set()
    t0 = time.monotonic()
    proc = start(["--strategy", "ring", "--workers", "3", "--steps", "3", "--workload", "synthetic",
                  "--fail", "worker=1,at=1", "--timeline"], root)
    code, out, err = finish(proc, timeout=120, seen=seen)
    # a process of the run that is still ending holds its semaphores until it has: give them as
    # long as the command took (its own measure of this machine's pace now), at least 10 s
    leftovers(seen, grace=max(10.0, time.monotonic() - t0))
    sems = [p.name for pid in seen for p in Path("/dev/shm").glob(f"sem.*{pid}-*")]
    return {"code": code, "out": out, "err": err, "sems": sems}


CASES = {**{f"signal {k}": (signal_case, v) for k, v in SIGNALS.items()},
         "kill -9": (kill9_case, ()), "disk 200k": (disk_case, ("200k",)), "disk 12k": (disk_case, ("12k",)),
         "head": (head_case, ()), "not ray": (not_ray_case, ()), "main command": (main_command_case, ())}


class Batch:
    """The cases, running four at a time on threads of this process, from `begin()` on.

    tests/conftest.py begins them as the session starts (they mostly wait, so they overlap the
    rest of the suite instead of adding to it); the `cases` fixture waits for them."""

    futures: dict[str, Any] | None = None
    pool: ThreadPoolExecutor | None = None
    root: Path | None = None

    @classmethod
    def begin(cls, root: Path) -> None:
        if cls.futures is not None:
            return
        cls.root = root

        def run(name):
            fn, args = CASES[name]
            try:
                return fn(root / name.replace(" ", "_"), *args)
            except BaseException as exc:  # noqa: BLE001 - reported by the case's test
                return exc

        cls.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="reliability")
        cls.futures = {name: cls.pool.submit(run, name) for name in CASES}

    @classmethod
    def end(cls) -> None:
        """Stop what is still running (an interrupted session) and let the threads go."""
        for proc in STARTED:
            if proc.poll() is None:
                with suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
        if cls.pool is not None:
            cls.pool.shutdown(wait=False, cancel_futures=True)
        if cls.root is not None and cls.root.name.startswith("testbed-reliability-"):
            shutil.rmtree(cls.root, ignore_errors=True)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """{case name: what it saw, or the exception it raised}."""
    Batch.begin(tmp_path_factory.mktemp("reliability"))
    return {name: future.result() for name, future in Batch.futures.items()}


def seen(cases, name) -> dict:
    got = cases[name]
    if isinstance(got, BaseException):
        raise got
    if "skip" in got:
        pytest.skip(got["skip"])
    return got


@pytest.mark.parametrize("name", list(SIGNALS))
def test_a_signal_ends_the_run_as_interrupted_with_everything_kept(cases, name):
    got = seen(cases, f"signal {name}")
    when = SIGNALS[name][2]
    assert got["code"] == 130, got["err"]
    # the command's own bounds (Ray given STARTUP_STUCK_S to finish starting, the actors and Ray
    # SHUTDOWN_INTERRUPTED_S to stop), plus twice what a bare command takes now (an interpreter
    # starting and exiting, measured beside this case: what a busy machine adds)
    limit = STARTUP_STUCK_S + SHUTDOWN_INTERRUPTED_S + 2 * got["bare"]
    assert got["took"] < limit, f"took {got['took']:.1f} s to end (limit {limit:.1f} s, bare command {got['bare']:.1f} s)"
    err = got["err"]
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("testbed.run: error: interrupted")
    lines = got["out"].strip().splitlines()
    if lines:  # a signal before the run folder existed leaves none
        assert len(lines) == 1
        run = load_run(lines[0])
        assert run["status"] == "interrupted" and run["summary"]["error"].startswith("interrupted by")
        if when == "run":
            assert len(run["updates"]) >= 5 and len(run["steps"]) >= 10
    assert not got["left"], f"processes of the run left behind: {got['left']}"


def test_kill_9_keeps_every_record_and_the_reader_says_crashed(cases):
    """(Ray's reaper stops its daemons when the driver dies; two of its agents can outlive a
    kill -9 by about a minute, which nothing in a process killed that way can prevent.)"""
    run = seen(cases, "kill -9")["run"]
    assert run["status"] == "crashed" and run["summary"] is None
    assert len(run["updates"]) >= 10 and len(run["steps"]) >= 20


@pytest.mark.parametrize("size", ["200k", "12k"])
def test_a_full_disk_is_one_line_and_failed_and_what_was_written_stays_readable(cases, size):
    got = seen(cases, f"disk {size}")
    assert got["code"] == 1, got["err"]
    err = got["err"]
    assert err.strip().count("\n") == 0 and "No space left on device" in err and "--out" in err
    run = got["run"]  # whatever was written reads back
    if run["summary"] is not None:
        assert run["status"] == "failed" and "No space left" in run["summary"]["error"]
    assert not got["params"] or run["status"] != "completed"


def test_beside_a_running_head_a_plain_run_is_private_and_a_wrong_token_is_named(cases):
    got = seen(cases, "head")
    code, out, err = got["plain"]
    assert code == 0, err
    assert load_run(out.strip())["status"] == "completed"
    code, out, err = got["wrong"]
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0 and "refused" in err and "token" in err
    assert got["wrong_took"] < 60


def test_an_address_that_is_not_ray_is_named_at_once(cases):
    got = seen(cases, "not ray")
    assert got["code"] == 2 and "not a Ray head" in got["err"] and got["err"].strip().count("\n") == 0
    # at once: beyond the command's own start-up (measured beside it), far less than Ray's 20
    # connection tries a second apart would take
    assert got["took"] - got["bare"] < 15, got


def test_the_main_command_in_its_own_process_leaves_dev_shm_as_found_and_stdout_clean(cases):
    """A ring run through the CLI, with a worker killed on the way: its private Ray, the table and
    the folder on stdout and nothing else (Ray's message about the death is in the folder), and
    the semaphores of its shared-memory links gone from /dev/shm."""
    got = seen(cases, "main command")
    assert got["code"] == 0, got["err"]
    err, out = got["err"], got["out"]
    assert "raylet" not in err and "Traceback" not in err and "worker died" not in err.lower()  # a progress bar only
    lines = out.strip().splitlines()
    assert lines[0].strip().startswith("strategy") and "samples/s" in out and Path(lines[-1]).is_dir()
    assert not any("raylet" in ln or "worker died" in ln.lower() for ln in lines)
    assert "worker died" in (Path(lines[-1]) / "ray.log").read_text().lower()
    assert got["sems"] == [], "semaphores of the run's raylet left in /dev/shm"
    run = load_run(lines[-1])
    assert [f["kind"] for f in run["summary"]["faults"]] == ["worker-restart"]
    assert (Path(lines[-1]) / "timeline.json").is_file() and run["status"] == "completed"
