"""Nothing lost, nothing hangs: signals to the process or its group at any moment, kill -9, a
full disk, a Ray head already running, an address that is not Ray, a wrong token, Ray's own
messages, and /dev/shm. Each case runs the CLI in its own process, as a user would."""

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
from pathlib import Path

import pytest

from testbed.analysis.results import load_run

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
RUN = [sys.executable, "-m", "testbed.run"]
LONG = ["--strategy", "ring", "--workers", "2", "--steps", "100000", "--workload", "synthetic",
        "--compute-ms", "20", "--grad-mb", "0.01", "--quiet"]


def ray_processes() -> set[int]:
    """Pids of Ray's daemons and workers on this machine."""
    out = set()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(k in cmd for k in ("raylet", "gcs_server", "default_worker.py", "log_monitor", "ray::")):
            out.add(int(p.name))
    return out


def start(args, out, **kw) -> subprocess.Popen:
    return subprocess.Popen([*RUN, *args, "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


def wait_updates(out: Path, n: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = list(out.glob("*/records.jsonl"))
        if logs and logs[0].read_text().count('"kind": "update"') >= n:
            return
        time.sleep(0.2)
    pytest.fail(f"no {n} updates within {timeout} s")


def finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"still running {timeout} s after the signal")
    return proc.returncode, out, err


def no_orphans(before: set[int], grace: float = 10.0) -> None:
    deadline = time.monotonic() + grace
    while (left := ray_processes() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"Ray processes left behind: {sorted(left)}"


# (signal, to the whole process group, when: "run" after 5 updates or seconds after launch, twice)
SIGNALS = [
    (signal.SIGTERM, True, "run", False),   # a batch scheduler, docker stop to a shell, kill -- -PGID
    (signal.SIGINT, False, "run", True),    # Ctrl-C, then Ctrl-C again a quarter second later
    (signal.SIGHUP, True, "run", False),    # the terminal closed
    (signal.SIGINT, True, 2.0, False),      # Ctrl-C while Ray starts
    (signal.SIGTERM, False, 3.0, False),    # kill PID while Ray starts
]


@pytest.mark.parametrize(("sig", "group", "when", "twice"), SIGNALS,
                         ids=[f"{s.name}-{'group' if g else 'process'}-{w}{'-twice' if t else ''}"
                              for s, g, w, t in SIGNALS])
def test_a_signal_ends_the_run_as_interrupted_with_everything_kept(tmp_path, sig, group, when, twice):
    before = ray_processes()
    proc = start(LONG, tmp_path)
    if when == "run":
        wait_updates(tmp_path, 5)
    else:
        time.sleep(when)
    send = os.killpg if group else os.kill
    t0 = time.monotonic()
    send(proc.pid, sig)
    if twice:
        time.sleep(0.25)
        send(proc.pid, sig)
    code, out, err = finish(proc)
    took = time.monotonic() - t0
    assert code == 130, err
    assert took < 15, f"took {took:.1f} s to end"
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("testbed.run: error: interrupted")
    lines = out.strip().splitlines()
    if lines:  # a signal before the run folder existed leaves none
        assert len(lines) == 1
        run = load_run(lines[0])
        assert run["status"] == "interrupted" and run["summary"]["error"].startswith("interrupted by")
        if when == "run":
            assert len(run["updates"]) >= 5 and len(run["steps"]) >= 10
    no_orphans(before)


def test_kill_9_keeps_every_record_and_the_reader_says_crashed(tmp_path):
    """(Ray's reaper stops its daemons when the driver dies; two of its agents can outlive a
    kill -9 by about a minute, which nothing in a process killed that way can prevent.)"""
    proc = start(LONG, tmp_path)
    wait_updates(tmp_path, 10)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    run = load_run(next(tmp_path.iterdir()))
    assert run["status"] == "crashed" and run["summary"] is None
    assert len(run["updates"]) >= 10 and len(run["steps"]) >= 20


@pytest.fixture
def tiny_disk(tmp_path):
    """A tmpfs of a few KB (root only: mounting needs it)."""
    mounted = []

    def make(size: str) -> Path:
        path = tmp_path / f"disk-{size}"
        path.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip() or 'not root'}): "
                        "the disk-full case needs root")
        mounted.append(path)
        return path

    yield make
    for path in mounted:
        subprocess.run(["umount", str(path)], capture_output=True)


@pytest.mark.parametrize("size", ["200k", "12k"])
def test_a_full_disk_is_one_line_and_failed_and_what_was_written_stays_readable(tiny_disk, size):
    out = tiny_disk(size)
    code, stdout, err = finish(start(["--strategy", "ring", "--workers", "2", "--steps", "400",
                                      "--workload", "synthetic", "--quiet"], out), timeout=120)
    assert code == 1, err
    assert err.strip().count("\n") == 0 and "No space left on device" in err and "--out" in err
    folder = Path(stdout.strip().splitlines()[-1])
    run = load_run(folder)  # whatever was written reads back
    if run["summary"] is not None:
        assert run["status"] == "failed" and "No space left" in run["summary"]["error"]
    assert not (folder / "params.npz").exists() or run["status"] != "completed"


@pytest.fixture
def ray_head(tmp_path):
    """A `ray start --head` of its own (its own temp dir, so it is stopped without touching any
    other Ray on the machine)."""
    temp = Path("/tmp") / f"rh-{uuid.uuid4().hex[:6]}"  # short: Ray's socket paths are limited
    port = _free_port()
    done = subprocess.run(["ray", "start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
                           f"--temp-dir={temp}", "--disable-usage-stats"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    yield f"127.0.0.1:{port}"
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


def test_beside_a_running_head_a_plain_run_is_private_and_a_wrong_token_is_named(tmp_path, ray_head):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    code, out, err = finish(start(["--strategy", "ring", "--workers", "2", "--steps", "3",
                                   "--workload", "synthetic", "--quiet"], tmp_path / "plain", env=env), timeout=120)
    assert code == 0, err
    assert load_run(out.strip())["status"] == "completed"

    env = {**os.environ, "RAY_AUTH_TOKEN": "not-the-token-of-that-cluster"}
    t0 = time.monotonic()
    code, out, err = finish(start(["--address", ray_head, "--workers", "1", "--steps", "1", "--quiet"],
                                  tmp_path / "attached", env=env), timeout=120)
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0 and "refused" in err and "token" in err
    assert time.monotonic() - t0 < 60


def test_an_address_that_is_not_ray_is_named_at_once(tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()  # says nothing
    t0 = time.monotonic()
    code, out, err = finish(start(["--address", f"127.0.0.1:{port}", "--quiet"], tmp_path), timeout=60)
    server.close()
    assert code == 2 and "not a Ray head" in err and err.strip().count("\n") == 0
    assert time.monotonic() - t0 < 20


def test_the_main_command_in_its_own_process_leaves_dev_shm_as_found_and_stdout_clean(tmp_path):
    """A ring run through the CLI, with a worker killed on the way: its private Ray, the table and
    the folder on stdout and nothing else (Ray's message about the death is in the folder), and
    the semaphores of its shared-memory links gone from /dev/shm."""
    shm = Path("/dev/shm")
    before = {p.name for p in shm.glob("sem.*")}
    code, out, err = finish(start(["--strategy", "ring", "--workers", "3", "--steps", "3", "--workload",
                                   "synthetic", "--fail", "worker=1,at=1", "--timeline"], tmp_path), timeout=120)
    assert code == 0, err
    assert "raylet" not in err and "Traceback" not in err and "worker died" not in err.lower()  # a progress bar only
    lines = out.strip().splitlines()
    assert lines[0].strip().startswith("strategy") and "samples/s" in out and Path(lines[-1]).is_dir()
    assert not any("raylet" in ln or "worker died" in ln.lower() for ln in lines)
    assert "worker died" in (Path(lines[-1]) / "ray.log").read_text().lower()
    assert {p.name for p in shm.glob("sem.*")} - before == set()
    run = load_run(lines[-1])
    assert [f["kind"] for f in run["summary"]["faults"]] == ["worker-restart"]
    assert (Path(lines[-1]) / "timeline.json").is_file() and run["status"] == "completed"
