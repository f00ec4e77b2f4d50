"""Attaching to a Ray head started with authentication off (`RAY_AUTH_MODE=disabled ray start
--head`) from a machine that holds a token: the run completes. Before, the driver went into
token mode because it held a token, refused the calls of that head's workers (which carry
none: "Missing authorization header"), and every actor died before it started (exit 1)."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

TIMEOUT_S = 180  # a bound against a hang only


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_head(temp: Path) -> None:
    for proc in Path("/proc").iterdir():  # every process of that head names its temp dir
        try:
            if proc.name.isdigit() and str(temp) in (proc / "cmdline").read_bytes().decode(errors="replace"):
                os.kill(int(proc.name), signal.SIGKILL)
        except OSError:
            pass
    shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow  # a head of its own and a run beside it: about 20 s
def test_a_run_attaches_to_a_head_without_authentication_although_it_holds_a_token(tmp_path):
    temp = Path("/tmp") / f"rh-{uuid.uuid4().hex[:6]}"  # short: Ray's socket paths are limited
    port = _free_port()
    ray = Path(sys.executable).with_name("ray")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    head = subprocess.run([str(ray), "start", "--head", f"--port={port}", "--num-cpus=1",
                           "--include-dashboard=false", f"--temp-dir={temp}", "--disable-usage-stats"],
                          env={**env, "RAY_AUTH_MODE": "disabled"}, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    try:
        assert head.returncode == 0, head.stderr
        run = subprocess.run([sys.executable, "-m", "testbed.run", "--address", f"127.0.0.1:{port}",
                              "--workers", "1", "--steps", "2", "--workload", "synthetic", "--quiet",
                              "--out", str(tmp_path)],
                             env={**env, "RAY_AUTH_TOKEN": "a-token-this-machine-holds"},
                             capture_output=True, text=True, timeout=TIMEOUT_S)
    finally:
        _kill_head(temp)
    assert run.returncode == 0, run.stderr
    summary = json.loads(Path(run.stdout.strip().splitlines()[-1], "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 2
