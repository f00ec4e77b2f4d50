"""Bad command lines: `python -m testbed.run` prints one stderr line and exits 2 before Ray starts.

Each case runs the real CLI in a subprocess from an empty folder. "Fast" (well under the time a
Ray start takes) and "no results folder" are how these tests see that no run began.
"""

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

TIMEOUT_S = 60
FAST_S = 20


def run_cli(args, cwd):
    """Run the CLI; return (returncode, stdout, stderr, seconds). Kills its group on timeout."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "testbed.run", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the group this test started, nothing else
        proc.communicate()
        pytest.fail(f"{args} still running after {TIMEOUT_S} s: validation let it start a run")
    return proc.returncode, out, err, time.monotonic() - t0


# (id, argv, text the error line must contain); "{file}" is replaced by a path to a file.
BAD = [
    ("workers-zero", ["--workers", "0"], "--workers 0"),
    ("workers-not-int", ["--workers", "abc"], "'abc'"),
    ("strategy-unknown", ["--strategy", "nope"], "'nope'"),
    ("lr-nan", ["--lr", "nan"], "--lr nan"),
    ("workload-unknown", ["--workload", "nope"], "'nope'"),
    ("bandwidth-zero", ["--bandwidth", "0Gbit", "--strategy", "mapreduce"], "'0Gbit'"),
    ("ps-shards-zero", ["--ps-shards", "0", "--strategy", "ps-sync"], "--ps-shards 0"),
    ("ps-flag-on-ring", ["--ps-shards", "2", "--strategy", "ring"], "--ps-shards 2"),
    ("transport-on-mapreduce", ["--transport", "torch", "--strategy", "mapreduce"], "'torch'"),
    ("payload-scaled-two", ["--workload", "synthetic", "--payload", "scaled:2"], "'scaled:2'"),
    ("latency-without-bandwidth", ["--latency", "50us"], "'50us'"),
    ("dilation-word", ["--workload", "synthetic", "--bandwidth", "1Gbit", "--dilation", "fast"], "'fast'"),
    ("dilation-auto-real-network", ["--workload", "synthetic", "--dilation", "auto"], "add --bandwidth"),
    ("dilation-auto-real-compute", ["--bandwidth", "1Gbit", "--dilation", "auto"], "real compute"),
    ("fidelity-budget-zero", ["--fidelity-budget", "0"], "--fidelity-budget 0"),
    ("fidelity-budget-nan", ["--fidelity-budget", "nan"], "--fidelity-budget nan"),
    ("real-workers-zero", ["--workers", "8", "--bandwidth", "1Gbit", "--real-workers", "0"], "--real-workers 0"),
    ("real-workers-word", ["--real-workers", "half"], "'half'"),
    ("real-workers-above-workers", ["--workers", "8", "--bandwidth", "1Gbit", "--real-workers", "9"],
     "--real-workers 9"),
    ("real-workers-ps", ["--strategy", "ps-async", "--workers", "8", "--bandwidth", "1Gbit", "--staleness-bound", "1",
                         "--real-workers", "2"],
     "--real-workers 8"),
    ("profile-unknown", ["--workload", "profile:alexnet"], "profile:resnet50"),
    ("profile-with-grad-mb", ["--workload", "profile:gpt2", "--grad-mb", "8"], "drop --grad-mb"),
    ("calibration-missing", ["--calibration", "{file}.none"], "testbed.bench network"),
    ("calibration-not-one", ["--calibration", "{file}"], "cannot read it"),
    ("out-is-a-file", ["--out", "{file}"], "{file}"),
    ("straggler-no-such-worker",
     ["--workers", "8", "--straggler", "fixed:worker=99,delay=200ms"],
     "'fixed:worker=99,delay=200ms'"),
    ("unknown-flag", ["--no-such-flag", "1"], "--no-such-flag"),
    ("address-unreachable", ["--address", "127.0.0.1:1", "--strategy", "mapreduce"], "'127.0.0.1:1'"),
    ("workers-beyond-memory", ["--workers", "4000", "--strategy", "mapreduce"], "--workers 4000"),
    ("fail-unknown-worker", ["--fail", "worker=9,at=1", "--workers", "2"], "worker=9"),
    ("checkpoint-on-ring", ["--checkpoint-every", "5", "--strategy", "ring"], "--checkpoint-every 5"),
    ("hosting-on-gossip", ["--workers-per-process", "4", "--workload", "synthetic", "--strategy", "gossip"],
     "--workers-per-process 4"),
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Run every BAD case, a few at a time (each is a Python start-up), keyed by case id."""
    root = tmp_path_factory.mktemp("cli")
    a_file = root / "not-a-folder"
    a_file.write_text("x")
    jobs = {}
    for case_id, argv, needle in BAD:
        work = root / case_id
        work.mkdir()
        jobs[case_id] = ([a.replace("{file}", str(a_file)) for a in argv],
                         needle.replace("{file}", str(a_file)), work)
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {k: pool.submit(run_cli, argv, work) for k, (argv, _, work) in jobs.items()}
        return {k: (jobs[k][1], jobs[k][2], f.result()) for k, f in futures.items()}


@pytest.mark.parametrize("case_id", [b[0] for b in BAD])
def test_bad_input_is_one_line_and_exit_2(outcomes, case_id):
    needle, work, (code, out, err, seconds) = outcomes[case_id]
    assert code == 2, (code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].strip(), err
    assert needle in lines[0], lines[0]
    assert "Traceback" not in err
    assert out == ""
    assert seconds < FAST_S, f"took {seconds:.1f} s: something slow (Ray?) ran before validation"
    assert list(work.iterdir()) == []  # no results folder: no run began


def test_help_exits_0(tmp_path):
    code, out, err, seconds = run_cli(["--help"], tmp_path)
    assert code == 0, err
    assert "usage:" in out and "--strategy" in out and "--straggler" in out
    assert err == ""
    assert seconds < FAST_S
