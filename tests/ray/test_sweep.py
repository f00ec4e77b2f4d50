"""testbed.sweep end to end on local Ray: table, figures, resume, a failing point, bad specs.

Each `main` call starts (and stops) its own Ray for the sweep, as the CLI does; the runs are
tiny (synthetic workload, N <= 2, 2 updates) so the module takes well under a minute of runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.sweep import load_table, main

pytestmark = pytest.mark.slow

SPEC = """
# tiny smoke grid
name = "tiny"
[base]
workload = "synthetic"
steps = 2
"workload.grad_mb" = 0.0625
"workload.compute_ms" = 1
[grid]
strategy = ["mapreduce", "ring"]
workers = [1, 2]
"""

# A point that fails every time: its only worker is killed at its first iteration and may not
# restart (a timeout short enough to fail a run is not: a quick answer can beat it).
KILL = "worker=0,at=1"
FAILING_FIRST = f'"faults.max_restarts" = [0]\n"faults.fail" = ["{KILL}", "none"]\n'
FAILING_SECOND = f'"faults.max_restarts" = [0]\n"faults.fail" = ["none", "{KILL}"]\n'


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    spec = root / "tiny.toml"
    spec.write_text(SPEC)
    out = root / "out"
    code = main([str(spec), "--out", str(out), "--quiet"])
    return spec, out, out / "tiny", code


def run_folders(sweep_dir):
    return sorted(p.name for p in (sweep_dir / "runs").iterdir() if p.is_dir())


def test_table_has_one_row_per_run(sweep):
    _, _, sweep_dir, code = sweep
    assert code == 0
    table = load_table(sweep_dir)
    assert len(table) == 4
    assert list(zip(table["strategy"], table["workers"], strict=True)) == [
        ("mapreduce", 1), ("mapreduce", 2), ("ring", 1), ("ring", 2)]
    for col in ("strategy", "workers", "workload.grad_mb", "network.bandwidth", "ps.shards",
                "repeat", "point_id", "status", "run_dir", "samples_per_s", "step_time_mean_s",
                "compute_frac", "steps_applied", "run_id"):
        assert col in table.columns, col
    assert (table["status"] == "completed").all()
    assert (table["steps_applied"] == 2).all()
    assert (table["workload.grad_mb"] == 0.0625).all()
    assert table.attrs["sweep"]["grid"] == ["strategy", "workers"]
    for run_dir in table["run_dir"]:
        assert (sweep_dir / "runs").resolve() in Path(run_dir).resolve().parents
        assert json.loads((Path(run_dir) / "summary.json").read_text())["status"] == "completed"
    assert not list(sweep_dir.glob(".*tmp*"))


def test_figures_are_drawn(sweep):
    figures = sweep[2] / "figures"
    names = {p.name for p in figures.iterdir()}
    assert {"throughput_vs_workers.png", "throughput_vs_workers.svg", "step_breakdown.png",
            "loss_vs_updates.png", "loss_vs_time.png"} <= names
    assert all((figures / n).stat().st_size > 1000 for n in names if n.endswith((".png", ".svg")))


def test_resume_reruns_only_the_unfinished_point(sweep):
    spec, out, sweep_dir, _ = sweep
    points = sweep_dir / "points.jsonl"
    lines = points.read_text().splitlines()
    lost = json.loads(lines[-1])
    points.write_text("\n".join(lines[:-1]) + "\n")  # as if killed before the last point ended
    (sweep_dir / "runs.parquet").unlink()
    before = run_folders(sweep_dir)
    kept_dirs = [json.loads(line)["run_dir"] for line in lines[:-1]]
    kept = {d: (sweep_dir / d / "summary.json").stat().st_mtime_ns for d in kept_dirs}

    assert main([str(spec), "--out", str(out), "--quiet"]) == 0

    after = run_folders(sweep_dir)
    assert len(after) == len(before) + 1
    assert set(after) - set(before) == {f"{lost['id']}-1"}  # a retry never overwrites a folder
    for run_dir, mtime in kept.items():
        assert (sweep_dir / run_dir / "summary.json").stat().st_mtime_ns == mtime
    table = load_table(sweep_dir)
    assert len(table) == 4 and (table["status"] == "completed").all()
    assert table.loc[table["point_id"] == lost["id"], "run_dir"].iloc[0].endswith(f"{lost['id']}-1")

    assert main([str(spec), "--out", str(out), "--quiet"]) == 0  # all done: nothing reruns
    assert run_folders(sweep_dir) == after


def test_failing_point_is_recorded_and_the_sweep_goes_on(tmp_path):
    spec = tmp_path / "flaky.toml"
    spec.write_text(SPEC.replace('name = "tiny"', 'name = "flaky"')
                    .replace('["mapreduce", "ring"]', '["mapreduce"]')
                    .replace("[1, 2]", "[1]") + FAILING_FIRST)
    assert main([str(spec), "--out", str(tmp_path), "--quiet"]) == 1
    records = [json.loads(line) for line in (tmp_path / "flaky" / "points.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records] == ["failed", "completed"]
    assert records[0]["error"]
    table = load_table(tmp_path / "flaky")
    assert list(table["status"]) == ["failed", "completed"]
    assert table["faults.fail"].tolist() == [KILL, "none"]


def test_update_baseline_measures_afresh_and_refuses_failed_runs(tmp_path, capsys):
    from testbed.strategies import registry
    from testbed.sweep.spec import expand, load_spec

    spec = tmp_path / "broken.toml"
    spec.write_text(SPEC.replace('name = "tiny"', 'name = "broken"')
                    .replace('["mapreduce", "ring"]', '["mapreduce"]')
                    .replace("[1, 2]", "[1]") + FAILING_SECOND)
    sweep_dir = tmp_path / "broken"
    points, _ = expand(load_spec(spec), registry.SPECS, str(sweep_dir / "runs"))
    old = sweep_dir / "runs" / f"{points[0].point_id}-0"  # as if completed by an earlier sweep
    old.mkdir(parents=True)
    (old / "summary.json").write_text("{}")
    (sweep_dir / "points.jsonl").write_text(json.dumps(
        {"id": points[0].point_id, "status": "completed", "run_dir": f"runs/{old.name}"}) + "\n")
    target = tmp_path / "baseline.json"
    argv = [str(spec), "--out", str(tmp_path), "--quiet", "--update-baseline", "--baseline", str(target),
            "--repeats", "3"]  # the fewest a baseline takes (it measures each point's spread)
    assert main(argv) == 1
    assert not target.exists()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"testbed.sweep: error: baseline {target} not written")
    table = load_table(sweep_dir)
    assert list(table["status"]) == ["completed", "failed"]  # stopped at the first failure
    assert table["run_dir"].iloc[0].endswith("-1")  # the completed point ran again, not reused


@pytest.mark.parametrize(("grid", "needle"), [
    ("workers = [0]", "workers"),
    ("workers = []", "grid.workers"),
    ('"ps.shard" = [2]', "grid.ps.shard"),
])
def test_bad_spec_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, grid, needle):
    from testbed.runtime import rayprocs

    started = []
    monkeypatch.setattr(rayprocs, "start_ray", lambda *a, **k: started.append(a))
    spec = tmp_path / "bad.toml"
    spec.write_text(SPEC.split("[grid]")[0] + f"[grid]\n{grid}\n")
    assert main([str(spec), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("testbed.sweep: error:") and "\n" not in err and needle in err
    assert not (tmp_path / "bad").exists()
    assert started == []  # the spec was refused before any Ray was asked for
