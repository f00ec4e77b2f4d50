"""Nothing lost, nothing hangs, without a cluster: the record log, the reader of a run that never
ended, disk-full writes, signal handling, divergence, and the sweep folder's guards."""

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from testbed.analysis.records import Recorder, UpdateRecord
from testbed.analysis.results import OutputError, RecordLog, RunFolder, load_run, read_log
from testbed.emulation.faults import Diverged
from testbed.session.interrupts import Interrupts
from testbed.sweep import main as sweep_main

# ---------------------------------------------------------------- records


def test_a_run_that_never_ended_reads_back_from_its_log(tmp_path):
    folder = RunFolder.create(tmp_path, "crashed-run")
    folder.write_config({"strategy": "ring"})
    log = folder.record_log()
    rec = Recorder(sink=log)
    for v in range(1, 4):
        rec.update(UpdateRecord(version=v, t_applied=10.0 + v, contributors=2, dropped=0, loss=1.0 / v))
    rec.event("worker0", "compute", 1.0, 2.0)
    log.close()
    with open(folder.path / RecordLog.NAME, "a") as fh:
        fh.write('{"kind": "update", "version": 4, "t_ap')  # a line the crash cut short
    run = load_run(folder.path)
    assert run["status"] == "crashed" and run["summary"] is None
    assert list(run["updates"]["version"]) == [1, 2, 3]
    assert len(run["events"]) == 1 and run["steps"].empty


def test_rolled_back_updates_leave_the_log_as_they_leave_the_table(tmp_path):
    log = RecordLog(tmp_path)
    rec = Recorder(sink=log)
    for v in range(1, 6):
        rec.update(UpdateRecord(version=v, t_applied=float(v), contributors=1, dropped=0, loss=0.0))
    rec.rollback(3)
    log.close()
    assert [u["version"] for u in read_log(tmp_path / RecordLog.NAME)["updates"]] == [1, 2, 3]


def test_a_full_disk_stops_the_log_with_one_line(tmp_path):
    (tmp_path / RecordLog.NAME).symlink_to("/dev/full")  # every write: ENOSPC
    log = RecordLog(tmp_path)
    rec = Recorder(sink=log)
    with pytest.raises(OutputError) as info:
        for v in range(1, 5000):  # line-buffered: the first line reaches the device at once
            rec.update(UpdateRecord(version=v, t_applied=0.0, contributors=1, dropped=0, loss=0.0))
    msg = str(info.value)
    assert "\n" not in msg and "No space left" in msg and "--out" in msg
    with pytest.raises(OutputError):  # and keeps saying so
        log("step", {})
    log.close()


# ---------------------------------------------------------------- divergence


def test_skipping_is_bounded_and_ends_as_diverged():
    rec = Recorder(max_skipped=2)
    rec.fault("nan-skipped", "worker0", 1, 0.0, 0.0)
    rec.fault("nan-skipped", "worker1", 1, 0.0, 0.0)
    with pytest.raises(Diverged, match="--max-skipped 2"):
        rec.fault("nan-skipped", "worker0", 2, 0.0, 0.0)
    assert len(rec.extra["faults"]) == 3  # recorded before the run stops
    Recorder(max_skipped=None).fault("worker-restart", "worker0", 1, 0.0, 1.0)  # other faults never count


# ---------------------------------------------------------------- signals


def test_the_first_signal_interrupts_later_ones_are_noted(capsys):
    before = signal.getsignal(signal.SIGINT)  # Python's own, or what this test process was given
    interrupts = Interrupts()
    with interrupts:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0.1) if hasattr(signal, "sigtimedwait") else None
        assert interrupts.name == "SIGTERM"
        os.kill(os.getpid(), signal.SIGINT)  # a second one does not cut the cleanup short
    assert "received again" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before  # restored


def test_a_signal_while_deferred_waits_for_the_block_and_shielded_ones_are_only_noted():
    interrupts = Interrupts()
    with interrupts:
        reached_end = False
        with pytest.raises(KeyboardInterrupt):
            with interrupts.deferred():
                os.kill(os.getpid(), signal.SIGHUP)
                sum(range(1000))  # the handler runs here, between bytecodes
                reached_end = True
        assert reached_end and interrupts.name == "SIGHUP"
    with interrupts:
        with interrupts.shielded():
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(1000))
        assert interrupts.name == "SIGINT"  # noted, nothing raised


# A block that outlives a signal by more than its watchdog's allowance (ray.init waiting for
# daemons the signal took): the watchdog runs `on_stuck` and the process exits 130 while the block
# is still inside; a block that ends first is left to end, and the signal is raised after it.
_STUCK = """
import os, signal, sys, threading, time
from testbed.session.interrupts import Interrupts
interrupts = Interrupts()
ended = threading.Event()
with interrupts:
    try:
        with interrupts.deferred(0.2, lambda: print("stuck, block ended:", ended.is_set(), flush=True)):
            os.kill(os.getpid(), signal.SIGTERM)
            {block}
            ended.set()
        print("block ended", flush=True)
    except KeyboardInterrupt:
        print("interrupted after the block", flush=True)
        time.sleep(0.5)  # longer than the allowance: a watchdog still looking would fire now
"""


@pytest.mark.parametrize(("block", "code", "out"), [
    ("threading.Event().wait()", 130, "stuck, block ended: False"),  # never ends: the watchdog ends it
    ("pass", 0, "interrupted after the block"),
])
def test_a_deferred_block_stuck_after_a_signal_is_ended_by_its_watchdog_and_only_then(block, code, out):
    import subprocess

    done = subprocess.run([sys.executable, "-c", _STUCK.format(block=block)], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert (done.returncode, done.stdout.strip()) == (code, out), done.stderr[-2000:]


# ---------------------------------------------------------------- sweeps

SPEC = """
name = "guard"
[base]
workload = "synthetic"
steps = 2
[grid]
workers = [1, 2]
"""


# A signal at the command's very start (its imports): the process is only running the handler-less
# interpreter for the first few tens of milliseconds; from then on `testbed.run` owns the signals.
# The child below sends itself the signal from inside the first import of numpy, where a slow
# machine was seen to be when a "while Ray starts" signal arrived.
_SIGNAL_DURING_IMPORTS = """
import os, runpy, signal, sys
class Trap:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.{sig})
        return None
sys.meta_path.insert(0, Trap())
sys.argv = ["testbed.run", "--strategy", "ring", "--workers", "8"]
runpy.run_module("testbed.run", run_name="__main__")
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize(("module", "argv", "line"), [
    ("testbed.run", ["--strategy", "ring", "--workers", "8"], "testbed.run: error: interrupted by {sig} before the run started"),
    ("testbed.sweep", ["experiments/regression.toml", "--out", "{tmp}"],
     "testbed.sweep: error: interrupted by {sig} before the sweep started"),
])
def test_a_signal_while_the_command_imports_ends_it_as_interrupted_before_ray(sig, module, argv, line, tmp_path):
    import subprocess

    code = (_SIGNAL_DURING_IMPORTS.format(sig=sig)
            .replace('["testbed.run", "--strategy", "ring", "--workers", "8"]',
                     repr([module, *(a.format(tmp=tmp_path) for a in argv)]))
            .replace('run_module("testbed.run"', f'run_module("{module}"'))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 130, (done.returncode, done.stderr[-2000:])
    assert done.stderr.strip() == line.format(sig=sig)
    assert done.stdout == "" and not list(tmp_path.iterdir())  # nothing ran, no folder


def test_a_sweep_folder_belongs_to_one_spec(tmp_path, capsys):
    spec = tmp_path / "guard.toml"
    spec.write_text(SPEC)
    sweep_dir = tmp_path / "out" / "guard"
    sweep_dir.mkdir(parents=True)
    (sweep_dir / "spec.json").write_text(json.dumps({"hash": "0" * 12, "spec": {}}))
    assert sweep_main([str(spec), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "holds the runs of another spec named 'guard'" in err and "another name or --out" in err


def test_two_sweeps_never_share_a_folder(tmp_path, capsys):
    import fcntl

    spec = tmp_path / "guard.toml"
    spec.write_text(SPEC)
    sweep_dir = tmp_path / "out" / "guard"
    sweep_dir.mkdir(parents=True)
    with open(sweep_dir / ".lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running sweep holds it
        assert sweep_main([str(spec), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert "another sweep is running there" in capsys.readouterr().err


@pytest.mark.parametrize(("content", "needle"), [
    (b"name = \"x\"\n[grid]\nworkers = [1]\n# \xff\xfe\n", "not UTF-8"),
    (b"", "asks for nothing"),
    (b"name = \"x\"\n", "asks for nothing"),
])
def test_unreadable_or_empty_specs_are_refused(tmp_path, capsys, content, needle):
    spec = tmp_path / "s.toml"
    spec.write_bytes(content)
    assert sweep_main([str(spec), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and needle in err and "Traceback" not in err


def test_a_huge_grid_at_a_terminal_needs_yes(tmp_path, capsys, monkeypatch):
    spec = tmp_path / "huge.toml"
    spec.write_text('[base]\nworkload = "synthetic"\n[grid]\nseed = ' + str(list(range(300))) + "\n")
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    assert sweep_main([str(spec), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "300 runs" in err and "--yes" in err
    assert not (tmp_path / "huge").exists()


def test_each_step_names_its_workers_node_and_a_fault_asks_again():
    from testbed.analysis.records import step_record

    where = {0: "10.0.0.1", 1: "10.0.0.2"}
    asked = []
    rec = Recorder()
    rec.locate(lambda: asked.append(1) or dict(where))
    report = {"t_start": 0.0, "compute_s": 0.1, "comm_s": 0.0, "bytes_sent": 0, "bytes_recv": 0,
              "samples": 1, "loss": 1.0, "injected_delay_s": 0.0}
    for w in (0, 1, 0):
        rec.step(step_record("r", "ring", w, 0, report, version_read=0, version_applied=1, wait_s=0.0))
    assert [s["node"] for s in rec.steps] == ["10.0.0.1", "10.0.0.2", "10.0.0.1"] and len(asked) == 1
    where[1] = "10.0.0.3"  # worker 1 lost its node and was restarted on another
    rec.fault("worker-restart", "worker1", 1, 0.0, 1.0)
    rec.step(step_record("r", "ring", 1, 1, report, version_read=1, version_applied=2, wait_s=0.0))
    assert rec.steps[-1]["node"] == "10.0.0.3" and len(asked) == 2


def test_the_sent_fault_parses_and_only_ps_workers_fire_it():
    from testbed.config import ConfigError, from_dict, validate
    from testbed.config.faultspec import Fault, format_faults, parse_faults
    from testbed.strategies.registry import SPECS

    faults = parse_faults("sent:worker=1,at=4")
    assert faults == (Fault("sent", "worker", 1, 4),) and format_faults(faults) == "sent:worker=1,at=4"
    with pytest.raises(ValueError, match="workers only"):
        parse_faults("sent:server=0,at=4")
    validate(from_dict({"strategy": "ps-async", "workers": 2, "faults": {"fail": "sent:worker=1,at=4"}}), SPECS)
    with pytest.raises(ConfigError, match="mapreduce workers cannot fire 'sent'"):
        validate(from_dict({"strategy": "mapreduce", "workers": 2, "faults": {"fail": "sent:worker=1,at=4"}}), SPECS)
