"""`python -m testbed.run` end to end: exit 0, every file present and readable, schema keys."""

import json
from pathlib import Path

from testbed.analysis.results import SCHEMA_VERSION, load_run

SUMMARY_KEYS = {
    "strategy", "workers", "steps", "samples_per_s", "updates_per_s", "step_time_p50_s",
    "step_time_p95_s", "compute_frac", "comm_frac", "wait_frac", "bytes_sent_per_worker_per_step",
    "loss_first", "loss_last", "status", "schema_version",
}
STEP_COLUMNS = {
    "run_id", "strategy", "worker", "iteration", "version_read", "version_applied", "t_start",
    "compute_s", "comm_s", "wait_s", "bytes_sent", "bytes_recv", "samples", "loss", "staleness",
    "injected_delay_s",
}


def test_cli_end_to_end(tmp_path, capsys):
    """The main command's path (in this process, on the session's Ray; tests/ray/test_reliability.py
    runs it in a process of its own): every file, the schema, the table."""
    from testbed.run import main

    code = main(["--strategy", "ring", "--workers", "2", "--steps", "3", "--out", str(tmp_path / "runs"),
                 "--timeline"])
    out = capsys.readouterr().out
    assert code == 0
    folder = Path(out.strip().splitlines()[-1])
    assert folder.parent == tmp_path / "runs"
    for name in ("config.json", "records.jsonl", "steps.parquet", "updates.parquet", "events.parquet",
                 "summary.json", "params.npz", "timeline.json"):
        assert (folder / name).is_file(), name
    run = load_run(folder)
    assert SUMMARY_KEYS <= set(run["summary"])
    assert run["summary"]["status"] == "completed" and run["summary"]["steps"] == 3
    assert run["summary"]["schema_version"] == SCHEMA_VERSION
    assert STEP_COLUMNS <= set(run["steps"].columns)
    assert len(run["steps"]) == 2 * 3 and len(run["updates"]) == 3
    assert run["config"]["config"]["strategy"] == "ring"
    assert "git_commit" in run["config"]["provenance"]
    trace = json.loads((folder / "timeline.json").read_text())
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert {"worker0", "worker1"} <= tracks
    assert "samples/s" in out  # the human table


def test_quiet_prints_only_the_folder(tmp_path, capsys):
    """In this process, on the session's Ray: exit code 0 and one stdout line, the folder."""
    from testbed.run import main

    code = main(["--strategy", "mapreduce", "--workers", "1", "--steps", "2", "--quiet",
                 "--workload", "logreg", "--out", str(tmp_path)])
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and Path(lines[0]).is_dir()
    assert load_run(lines[0])["summary"]["strategy"] == "mapreduce"
