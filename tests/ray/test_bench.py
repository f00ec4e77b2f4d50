"""The allreduce benchmark end to end (tiny): every method runs, is verified and timed; bad input exits 2."""

import json
import os

import pytest
import ray

from testbed.bench.cli import main
from testbed.bench.lib import METHODS


def test_bench_allreduce_writes_every_method_verified(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(["allreduce", "--workers", "2", "--sizes", "4KB", "--repeats", "1",
                 "--warmup", "0", "--out", str(out)])
    assert code == 0
    assert ray.is_initialized()  # the module's Ray is reused and left running
    doc = json.loads(out.read_text())
    rows = {r["method"]: r for r in doc["results"]}
    assert set(rows) == set(METHODS)
    for r in rows.values():
        assert r["workers"] == 2 and r["size_bytes"] == 4000
        checked = r["verified"]
        assert checked["copies"] >= 2 and checked["elements"] == 1000
        assert checked["max_abs_err"] <= checked["atol"]
        assert len(r["samples_s"]) == 1 and r["samples_s"][0] > 0
        assert r["median_s"] > 0 and r["algbw_Bps"] > 0
        assert r["cpu_s_median"] > 0  # CPU-seconds the round cost its processes
        assert r["busbw_Bps"] == pytest.approx(r["algbw_Bps"])  # 2(N-1)/N = 1 at N=2
    assert rows["gloo"]["ratio_to_gloo"] == pytest.approx(1.0)
    lats = {(x["method"], x["hop_load"]): x for x in doc["latency"]}
    assert set(lats) == {("ring-objstore", "idle"), ("ring-calls", "idle")}  # "loaded" needs N >= 4
    for lat in lats.values():
        assert lat["workers"] == 2 and lat["hop_s"] > 0 and lat["ratio"] > 0
        assert lat["ring_s"] == pytest.approx(rows[lat["method"]]["median_s"])
        assert 0 < lat["cpu_floor_s"] == pytest.approx(rows[lat["method"]]["cpu_s_median"] / os.cpu_count())
    text = capsys.readouterr().out
    assert "machine:" in text and "ring-objstore" in text and "latency N=2" in text


@pytest.mark.parametrize("argv, names", [
    (["allreduce", "--workers", "2,x"], "--workers 'x'"),
    (["allreduce", "--sizes", "4KB,5"], "--sizes '5'"),
    (["allreduce", "--sizes", "4QB"], "--sizes '4QB'"),
    (["allreduce", "--repeats", "0"], "--repeats 0"),
    (["allreduce", "--bogus"], "--bogus"),
])
def test_bench_bad_argument_is_one_line_exit_2(argv, names, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and names in err and err.startswith("testbed.bench: error:")
