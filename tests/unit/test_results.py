"""Tests for testbed.analysis.results: run folders, atomic writes, schema versions, reading back, traces.

provenance() is replaced by a fixed dict in the round-trip tests so they never run git.
"""

import json
import subprocess

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from testbed.analysis import provenance as prov
from testbed.analysis import results
from testbed.analysis.metrics import summarize
from testbed.analysis.records import Recorder, StepRecord, UpdateRecord
from testbed.analysis.results import (
    SCHEMA_VERSION,
    TABLES,
    RunFolder,
    chrome_trace,
    load_run,
    new_run_id,
    write_json,
)
from testbed.config import RunConfig, from_dict

FAKE_PROVENANCE = {"git_commit": "0" * 40, "git_dirty": False, "python": "3"}


@pytest.fixture(autouse=True)
def no_git(monkeypatch):
    monkeypatch.setattr(results, "provenance", lambda: dict(FAKE_PROVENANCE))


def recorder_with_records():
    rec = Recorder()
    rec.locate(lambda: {0: "10.0.0.1", 1: "10.0.0.2"})
    for it in range(2):
        for w in range(2):
            rec.step(StepRecord(
                run_id="r1", strategy="ring", worker=w, iteration=it, version_read=it,
                version_applied=it + 1, t_start=1000.0 + it + 0.01 * w, compute_s=0.25,
                comm_s=0.125, wait_s=0.0625 * w, bytes_sent=3 * 2**20, bytes_recv=3 * 2**20,
                samples=16, loss=1.5 - 0.5 * it, staleness=0, injected_delay_s=0.0))
        rec.update(UpdateRecord(version=it + 1, t_applied=1000.5 + it, contributors=2,
                                dropped=0, loss=1.5 - 0.5 * it))
    rec.event("worker0", "compute", 1000.0, 1000.25)
    rec.events_from([("worker1", "send", 1000.3, 1000.4), ("driver", "reduce", 1000.4, 1000.45)])
    return rec


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or ".tmp" in p.name)


def test_new_run_id_names_strategy_and_workers():
    rid = new_run_id("ps-sync", 8)
    assert "-ps-sync-n8-" in rid and "/" not in rid


def test_create_makes_parents_and_never_overwrites(tmp_path):
    folder = RunFolder.create(tmp_path / "a" / "runs", "run-1")
    assert folder.path == tmp_path / "a" / "runs" / "run-1" and folder.path.is_dir()
    (folder.path / "summary.json").write_text("{}")
    with pytest.raises(FileExistsError):
        RunFolder.create(tmp_path / "a" / "runs", "run-1")
    assert (folder.path / "summary.json").read_text() == "{}"  # the first run is untouched
    assert RunFolder.create(tmp_path / "a" / "runs", "run-2").path.is_dir()


def test_round_trip(tmp_path):
    cfg = RunConfig(strategy="ring", workers=2, steps=2, out=str(tmp_path))
    rec = recorder_with_records()
    folder = RunFolder.create(tmp_path, "run-rt")
    folder.write_config(cfg.to_dict(), machine={"cpus": 2})
    folder.write_records(rec)
    steps = pd.DataFrame(rec.steps, columns=list(TABLES["steps"]))
    updates = pd.DataFrame(rec.updates, columns=list(TABLES["updates"]))
    events = pd.DataFrame(rec.events, columns=list(TABLES["events"]))
    summary = summarize(steps, updates, strategy="ring", workers=2, status="completed")
    folder.write_summary(summary)
    params = {"layer.0.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
              "layer.0.bias": np.array([0.5, -0.25], dtype=np.float32)}
    folder.write_params(params)

    run = load_run(folder.path)
    pd.testing.assert_frame_equal(run["steps"], steps)
    pd.testing.assert_frame_equal(run["updates"], updates)
    pd.testing.assert_frame_equal(run["events"], events)
    assert run["config"]["schema_version"] == SCHEMA_VERSION
    assert run["config"]["provenance"] == FAKE_PROVENANCE
    assert run["config"]["machine"] == {"cpus": 2}
    assert from_dict(run["config"]["config"]) == cfg
    assert run["summary"]["schema_version"] == SCHEMA_VERSION
    assert run["summary"]["samples_per_s"] == pytest.approx(summary["samples_per_s"])
    assert run["summary"]["updates_per_worker"] == {"0": 2, "1": 2}  # JSON keys are strings
    assert run["params"].keys() == params.keys()
    for name, value in params.items():
        assert run["params"][name].dtype == value.dtype
        np.testing.assert_array_equal(run["params"][name], value)
    for name in TABLES:
        meta = pq.read_schema(folder.path / f"{name}.parquet").metadata
        assert meta[b"testbed_schema_version"] == str(SCHEMA_VERSION).encode()
    assert leftovers(folder.path) == []


def test_empty_tables_round_trip_with_their_columns(tmp_path):
    folder = RunFolder.create(tmp_path, "run-empty")
    folder.write_config(RunConfig().to_dict())
    folder.write_records(Recorder())
    run = load_run(folder.path)
    for name, columns in TABLES.items():
        assert list(run[name].columns) == list(columns) and len(run[name]) == 0
    assert run["summary"] is None and "params" not in run


def test_load_run_without_tables_gives_empty_frames(tmp_path):
    folder = RunFolder.create(tmp_path, "run-config-only")
    folder.write_config(RunConfig().to_dict())
    run = load_run(folder.path)
    assert all(list(run[n].columns) == list(c) for n, c in TABLES.items())


def test_rewrites_replace_atomically_and_leave_no_tmp(tmp_path):
    folder = RunFolder.create(tmp_path, "run-atomic")
    rec = recorder_with_records()
    for _ in range(3):  # the recorder's sink rewrites the tables as records stream in
        folder.write_records(rec)
        folder.write_summary({"status": "running"})
    folder.write_summary({"status": "completed"})
    assert json.loads((folder.path / "summary.json").read_text())["status"] == "completed"
    assert leftovers(folder.path) == []
    assert sorted(p.name for p in folder.path.iterdir()) == [
        "events.parquet", "steps.parquet", "summary.json", "updates.parquet"]


def test_failed_write_keeps_previous_version_and_leaves_no_tmp(tmp_path):
    target = tmp_path / "summary.json"
    write_json(target, {"v": 1})

    def broken(tmp):
        tmp.write_text('{"v": 2, "tor')  # half written, then the writer dies
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        results._atomic_write(target, broken)
    assert json.loads(target.read_text()) == {"v": 1}
    assert leftovers(tmp_path) == []


def test_write_json_handles_numpy_values(tmp_path):
    write_json(tmp_path / "x.json", {"i": np.int64(3), "f": np.float32(0.5),
                                     "a": np.arange(3)})
    assert json.loads((tmp_path / "x.json").read_text()) == {"i": 3, "f": 0.5, "a": [0, 1, 2]}


def test_chrome_trace_tracks_and_spans():
    events = [
        {"actor": "worker10", "phase": "compute", "t0": 10.0, "t1": 10.5},
        {"actor": "worker2", "phase": "send", "t0": 10.1, "t1": 10.2},
        {"actor": "driver", "phase": "reduce", "t0": 10.2, "t1": 10.3},
        {"actor": "worker2", "phase": "wait", "t0": 10.4, "t1": 10.39},  # clock skew
        {"actor": "worker10", "phase": "apply", "t0": 10.6, "t1": 10.6},
    ]
    trace = chrome_trace(events, t0=10.0)
    json.dumps(trace, allow_nan=False)
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert all(m["name"] == "thread_name" for m in meta)
    names = [m["args"]["name"] for m in meta]
    assert names == ["driver", "worker2", "worker10"]  # one per actor, numeric order
    tid = {m["args"]["name"]: m["tid"] for m in meta}
    assert len(set(tid.values())) == 3
    assert len(spans) == len(events)
    for span, event in zip(spans, events, strict=True):
        assert span["tid"] == tid[event["actor"]] and span["name"] == event["phase"]
        assert span["ts"] == pytest.approx((event["t0"] - 10.0) * 1e6)
        assert span["dur"] >= 0
    assert spans[0]["dur"] == pytest.approx(0.5e6)
    assert spans[3]["dur"] == 0.0


def test_chrome_trace_empty():
    assert chrome_trace([], 0.0)["traceEvents"] == []


def test_write_timeline(tmp_path):
    folder = RunFolder.create(tmp_path, "run-tl")
    trace = chrome_trace([{"actor": "worker0", "phase": "compute", "t0": 1.0, "t1": 2.0}], 1.0)
    folder.write_timeline(trace)
    assert json.loads((folder.path / "timeline.json").read_text()) == trace


def test_provenance_without_git(monkeypatch):
    monkeypatch.undo()  # the real provenance(), with git replaced below
    calls, real_run = [], subprocess.run

    def no_git(args, **kwargs):
        if args[0] != "git":  # platform.platform() may shell out to uname
            return real_run(args, **kwargs)
        calls.append(args)
        raise OSError("git not installed")

    monkeypatch.setattr(prov.subprocess, "run", no_git)
    info = prov.provenance()
    assert info["git_commit"] is None and info["git_dirty"] is None
    assert info["numpy"] == np.__version__ and info["cpu_count"] >= 1
    assert len(calls) == 2


def test_provenance_dirty_flag_and_no_index_lock(monkeypatch):
    monkeypatch.undo()
    calls, real_run = [], subprocess.run

    def fake_git(args, **kwargs):
        if args[0] != "git":
            return real_run(args, **kwargs)
        calls.append(args)
        out = "abc123\n" if "rev-parse" in args else " M testbed/config.py\n"
        return subprocess.CompletedProcess(args, 0, stdout=out, stderr="")

    monkeypatch.setattr(prov.subprocess, "run", fake_git)
    info = prov.provenance()
    assert info["git_commit"] == "abc123" and info["git_dirty"] is True
    status = next(c for c in calls if "status" in c)
    assert "--no-optional-locks" in status  # a run must never race the user's git for index.lock
