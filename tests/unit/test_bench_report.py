"""The allreduce benchmark's targets (testbed.bench.report) and their judgement over several runs
(testbed.bench.judge), from rows written by hand."""

import pytest

from testbed.bench import judge
from testbed.bench.cli import SCHEMA, main
from testbed.bench.report import TARGET_CPU_S, TARGET_TIME_RATIO, targets


def _row(n: int, size: int, method: str, time_s: float, cpu_s: float = 0.0) -> dict:
    return {"workers": n, "size_bytes": size, "method": method, "median_s": time_s,
            "cpu_s_median": cpu_s, "busbw_Bps": size / time_s}


def _by_name(rows: list[dict]) -> dict:
    return {t["name"]: t for t in targets(rows, [])}


@pytest.mark.parametrize("cpu, met", [(0.5 * TARGET_CPU_S, True), (TARGET_CPU_S, True), (1.01 * TARGET_CPU_S, False)])
def test_the_cpu_target_reads_the_ring_at_eight_workers_and_4kb(cpu, met):
    got = _by_name([_row(8, 4000, "ring-objstore", 0.005, cpu), _row(8, 4000, "gloo", 0.008, 0.001)])
    t = got["ring-objstore cpu (ms), N=8, 4.00 KB"]
    assert t["value"] == pytest.approx(cpu * 1e3) and t["met"] is met


def test_the_time_target_is_the_ratio_to_gloo_in_the_same_run_at_each_worker_count():
    size = 64 * 10**6
    rows = [_row(4, size, "ring-objstore", 0.050), _row(4, size, "gloo", 0.100),
            _row(8, size, "ring-objstore", 0.070), _row(8, size, "gloo", 0.100)]
    got = _by_name(rows)
    four, eight = got["time ring-objstore / gloo, N=4, 64.0 MB"], got["time ring-objstore / gloo, N=8, 64.0 MB"]
    assert four["value"] == pytest.approx(0.5) and four["met"]
    assert eight["value"] == pytest.approx(0.7) and not eight["met"] and 0.7 > TARGET_TIME_RATIO


def test_a_target_whose_size_the_run_did_not_measure_is_left_out():
    got = _by_name([_row(2, 4000, "ring-objstore", 0.001, 0.001), _row(2, 4000, "gloo", 0.002)])
    assert got == {}


def _doc(ratios: tuple[float, float], cpu: float) -> dict:
    """A benchmark document as `--out` writes it, with the rows the targets read."""
    size = 64 * 10**6
    rows = [_row(8, 4000, "ring-objstore", 0.005, cpu), _row(8, 4000, "gloo", 0.008, 0.010),
            _row(4, size, "ring-objstore", ratios[0] * 0.1, 0.1), _row(4, size, "gloo", 0.1, 0.2),
            _row(8, size, "ring-objstore", ratios[1] * 0.2, 0.2), _row(8, size, "gloo", 0.2, 0.4)]
    return {"schema": SCHEMA, "command": ["python", "-m", "testbed.bench", "allreduce"], "results": rows,
            "machine": {"cpus": 2, "memory_bytes": 2**30, "platform": "p", "python": "3", "numpy": "2",
                        "torch": "2", "ray": "2"}, "targets": targets(rows, [])}


def test_targets_over_runs_are_judged_by_their_median_not_by_each_run():
    docs = [_doc((0.55, 0.62), 0.006), _doc((0.58, 0.59), 0.008), _doc((0.70, 0.58), 0.0065)]
    got = {t["name"]: t for t in judge.judge(docs)}
    four, eight = got["time ring-objstore / gloo, N=4, 64.0 MB"], got["time ring-objstore / gloo, N=8, 64.0 MB"]
    assert four["median"] == pytest.approx(0.58) and four["met"] and four["runs_met"] == 2
    assert eight["median"] == pytest.approx(0.59) and eight["met"] and eight["runs_met"] == 2
    cpu = got["ring-objstore cpu (ms), N=8, 4.00 KB"]
    assert cpu["median"] == pytest.approx(6.5) and cpu["met"] and cpu["runs_met"] == 2
    page = judge.markdown(docs, judge.judge(docs), ["a.json", "b.json", "c.json"])
    assert "| time ring-objstore / gloo, N=8, 64.0 MB | 0.620 | 0.590 | 0.580 | 0.590 | <= 0.6 | met |" in page
    assert "| 8 | 64.0 MB | gloo | 200 ms | 200 ms | 200 ms |" in page  # gloo beside the ring, every run


def test_targets_refuses_a_file_that_is_not_a_benchmark_document(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    for path in (str(bad), str(tmp_path / "missing.json")):
        assert main(["targets", path]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and path in err and "--out file" in err
