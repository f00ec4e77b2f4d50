"""Compression on the driver and parameter-server strategies: bytes after compression, results close."""

import numpy as np
import pytest

from testbed.training.compressor import topk_count
from tests.ray.helpers import make_config, run_strategy

SYN = {"workload.name": "synthetic", "workload.grad_mb": 0.05, "workload.compute_ms": 0.0}


@pytest.mark.parametrize("strategy", ["mapreduce", "ps-sync", "ps-async"])
def test_fp16_halves_the_bytes_and_stays_close(strategy):
    plain = run_strategy(make_config(strategy=strategy, workers=2, steps=4, **SYN))
    half = run_strategy(make_config(strategy=strategy, workers=2, steps=4, compression="fp16", **SYN))
    k = plain["extra"]["grad_bytes_logical"]
    assert (plain["steps"]["bytes_sent"] == k).all()
    assert (half["steps"]["bytes_sent"] == k // 2).all()
    if strategy != "ps-async":  # async interleaving differs run to run
        np.testing.assert_allclose(half["flat"], plain["flat"], rtol=1e-2, atol=1e-3)


def test_topk_bytes_match_k_on_the_parameter_server():
    cfg = make_config(strategy="ps-sync", workers=2, steps=3, compression="topk:0.01",
                      **{**SYN, "ps.shards": 2})
    out = run_strategy(cfg)
    numel = out["extra"]["grad_bytes_logical"] // 4
    halves = [numel // 2 + (numel % 2), numel // 2]
    expected = sum(8 * topk_count(n, 0.01) for n in halves)  # (int32 index, float32 value) pairs
    assert (out["steps"]["bytes_sent"] == expected).all()
    assert np.isfinite(out["flat"]).all()
