"""Gradient compression: spec parsing, fp16 error, top-k byte counts and error feedback, flags."""

import numpy as np
import pytest

from testbed.config import ConfigError, RunConfig, validate, with_overrides
from testbed.strategies.registry import SPECS
from testbed.training.compressor import (
    CompressionSpec,
    Compressor,
    pack_sparse,
    parse_compression,
    topk_count,
    unpack_sparse,
)


def _grad(n, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


@pytest.mark.parametrize(("text", "spec"), [
    ("none", CompressionSpec("none")), ("fp16", CompressionSpec("fp16")),
    ("topk:0.01", CompressionSpec("topk", 0.01)), ("topk:1", CompressionSpec("topk", 1.0)),
])
def test_parse(text, spec):
    assert parse_compression(text) == spec
    assert str(spec) == text


@pytest.mark.parametrize("text", ["", "fp8", "topk", "topk:0", "topk:1.5", "topk:x", "fp16:2", "none:1"])
def test_parse_rejects_with_one_line(text):
    with pytest.raises(ValueError) as info:
        parse_compression(text)
    assert repr(text) in str(info.value) and "topk:0.01" in str(info.value)


def test_none_is_the_identity_with_4_bytes_per_element():
    g = _grad(100)
    dense, nbytes = Compressor(CompressionSpec("none"), 100).roundtrip(g)
    np.testing.assert_array_equal(dense, g)
    assert nbytes == 400


def test_fp16_is_within_half_precision_of_uncompressed():
    g = _grad(10_000)
    comp = Compressor(parse_compression("fp16"), g.size)
    dense, nbytes = comp.roundtrip(g)
    assert nbytes == 2 * g.size == comp.payload_bytes
    assert dense.dtype == np.float32
    np.testing.assert_allclose(dense, g, rtol=2**-11, atol=2**-24)
    assert not np.array_equal(dense, g)  # it did round


@pytest.mark.parametrize(("numel", "fraction", "k"), [
    (1000, 0.01, 10), (300, 0.01, 3), (10, 0.01, 1), (7, 1.0, 7), (101, 0.5, 51), (0, 0.1, 0),
])
def test_topk_count(numel, fraction, k):
    assert topk_count(numel, fraction) == k


@pytest.mark.parametrize(("numel", "fraction"), [(1000, 0.01), (4097, 0.001), (50, 0.2), (3, 1.0)])
def test_topk_sends_exactly_k_pairs_of_8_bytes(numel, fraction):
    comp = Compressor(parse_compression(f"topk:{fraction}"), numel)
    g = _grad(numel)
    payload = comp.compress(g)
    k = topk_count(numel, fraction)
    assert payload.nbytes == 8 * k == comp.payload_bytes
    idx, vals = unpack_sparse(payload)
    assert len(idx) == k and np.all(np.diff(idx) > 0)  # sorted, distinct
    # they are the k largest magnitudes
    assert np.abs(vals).min() >= np.sort(np.abs(g))[::-1][k - 1] - 1e-7
    dense = comp.decompress(payload)
    assert np.count_nonzero(dense) == k


def test_topk_error_feedback_loses_nothing():
    """What is not sent stays in the residual: sent + residual == all gradients so far."""
    numel = 500
    comp = Compressor(parse_compression("topk:0.02"), numel)
    total_in = np.zeros(numel, np.float64)
    total_out = np.zeros(numel, np.float64)
    for step in range(30):
        g = _grad(numel, seed=step)
        total_in += g
        dense, nbytes = comp.roundtrip(g)
        total_out += dense
        assert nbytes == 8 * 10
    np.testing.assert_allclose(total_out + comp.residual, total_in, rtol=1e-5, atol=1e-4)
    # every coordinate is sent eventually: the residual stays bounded
    assert np.abs(comp.residual).max() < 30 * np.abs(total_in).max()


def test_topk_sgd_converges_on_a_quadratic():
    target = _grad(200, seed=9)
    w = np.zeros(200, np.float32)
    comp = Compressor(parse_compression("topk:0.05"), 200)
    for _ in range(1500):  # the residual applies gradients late: a small lr keeps it stable
        dense, _ = comp.roundtrip(w - target)
        w -= 0.05 * dense
    assert np.linalg.norm(w - target) < 1e-2 * np.linalg.norm(target)


def test_pack_round_trip_and_size_check():
    idx, vals = np.array([0, 5, 2**20], np.int32), np.array([1.5, -2.0, 3.0], np.float32)
    i2, v2 = unpack_sparse(pack_sparse(idx, vals))
    np.testing.assert_array_equal(i2, idx)
    np.testing.assert_array_equal(v2, vals)
    with pytest.raises(ValueError, match="one Compressor per tensor"):
        Compressor(CompressionSpec("fp16"), 10).compress(np.zeros(11, np.float32))


# ---------------------------------------------------------------- flags


def _cfg(**changes):
    return validate(with_overrides(RunConfig(), **changes), SPECS)


def test_compression_flag_validates():
    assert str(_cfg(compression="fp16").compression) == "fp16"
    assert _cfg(compression="topk:0.01").compression == CompressionSpec("topk", 0.01)
    assert str(_cfg(strategy="gossip", compression="fp16").compression) == "fp16"
    assert _cfg(compression="fp16", **{"ring.algorithm": "tree"}).ring.algorithm == "tree"


@pytest.mark.parametrize(("changes", "needle"), [
    ({"compression": "zip"}, "--compression 'zip': use none, fp16 or topk:F"),
    ({"compression": "topk:0.01", "ring.algorithm": "tree"}, "use --algorithm ring (got tree)"),
    ({"strategy": "allreduce-torch", "compression": "fp16"}, "--compression 'fp16': applies to --strategy"),
    ({"strategy": "gossip", "compression": "topk:0.1"}, "gossip averages parameters"),
])
def test_compression_flag_rejected_with_one_line(changes, needle):
    with pytest.raises(ConfigError) as info:
        _cfg(**changes)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_cli_parses_compression():
    from testbed.config import parse_config

    assert str(parse_config(["--compression", "topk:0.01"], SPECS).compression) == "topk:0.01"
