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
    (["models", "--workloads", "synthetic"], "--workloads 'synthetic'"),
    (["models", "--workers", "0"], "--workers '0'"),
])
def test_bench_bad_argument_is_one_line_exit_2(argv, names, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and names in err and err.startswith("testbed.bench: error:")


def test_bench_network_writes_a_calibration_that_gives_real_runs_a_prediction(tmp_path, capsys):
    """Two paths measured at two sizes far apart; the file loads; a real-network ring run with it
    gets the model's time from the channel's alpha and beta, beside its measured communication."""
    from testbed.config.calibration import load_calibration
    from tests.ray.helpers import make_config, run_strategy

    out = tmp_path / "cal.json"
    code = main(["network", "--sizes", "4KiB,1MiB", "--paths", "channel,call", "--repeats", "5",
                 "--warmup", "2", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    doc = json.loads(out.read_text())
    for path in ("channel", "call"):
        entry = doc["paths"][path]
        assert entry["sizes_bytes"] == [4096, 2**20] and len(entry["samples"]["4096"]) == 5
        assert entry["one_way_s_p10"][0] <= entry["one_way_s"][0] <= entry["one_way_s_p90"][0]
    cal = load_calibration(str(out))
    assert doc["scope"] == "same node" and set(cal.links) == {"channel", "call"}
    link = cal.links["channel"]
    s = run_strategy(make_config(strategy="ring", workers=2, steps=4, **{
        "workload.name": "synthetic", "workload.grad_mb": 1.0, "workload.compute_ms": 0.0,
        "network.calibration": str(out)}))["summary"]
    k = s["grad_bytes_logical"]
    assert s["predicted_comm_s"] == pytest.approx(2 * (link.alpha_s + k / 2 / link.bandwidth_Bps))
    assert s["prediction_source"] == cal.link("channel", across=False)[1]
    assert s["calibrated_fit"] == pytest.approx(s["comm_s_per_step"] / s["predicted_comm_s"])
    assert "emulation_fidelity" not in s and "prediction_missing" not in s


def test_bench_models_times_each_model_alone_and_beside_others(tmp_path, capsys):
    """Real processes, one torch thread each; every sample kept, the contention model beside."""
    out = tmp_path / "models.json"
    assert main(["models", "--workloads", "transformer", "--workers", "1,2", "--steps", "3",
                 "--warmup", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    rows = {(r["workload"], r["workers"]): r for r in doc["rows"]}
    assert set(rows) == {("transformer", 1), ("transformer", 2)}
    for (_, w), r in rows.items():
        assert len(r["samples_s"]) == 3 * w and r["median_s"] > 0
    assert rows[("transformer", 2)]["model_s"] == rows[("transformer", 1)]["together_s"] * max(1, 2 / doc["cores"])
    assert rows[("transformer", 2)]["together_s"] >= 0.9 * rows[("transformer", 2)]["median_s"]
    assert rows[("transformer", 1)]["params"] == 106240 and "transformer" in text
