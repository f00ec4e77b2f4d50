"""Tests for testbed.util.units: parsing tables, rejection tables, formatting."""

import math

import pytest

from testbed.util.units import (
    format_bytes,
    format_seconds,
    parse_bandwidth,
    parse_duration,
    parse_size,
)

SIZES = [
    ("1000", 1000),
    ("0", 0),
    ("4B", 4),
    ("4KB", 4_000),
    ("4kb", 4_000),
    ("256KiB", 256 * 1024),
    ("256kib", 256 * 1024),
    ("4MB", 4_000_000),
    ("64MiB", 64 * 1024 * 1024),
    ("1.5GB", 1_500_000_000),
    ("1GiB", 1024**3),
    ("2TB", 2 * 10**12),
    (" 3 MB ", 3_000_000),
    ("1e3KB", 1_000_000),
]


@pytest.mark.parametrize(("text", "expected"), SIZES)
def test_parse_size(text, expected):
    got = parse_size(text)
    assert got == expected
    assert isinstance(got, int)


BANDWIDTHS = [
    ("10Gbit", 10e9 / 8),
    ("10Gbps", 10e9 / 8),
    ("10Gbit/s", 10e9 / 8),
    ("10gbit", 10e9 / 8),
    ("400Mbit", 400e6 / 8),
    ("1e9bit", 1e9 / 8),
    ("1.25GB/s", 1.25e9),
    ("100MB/s", 100e6),
    ("100MBps", 100e6),
    ("1GiB/s", 1024**3),
]


@pytest.mark.parametrize(("text", "expected"), BANDWIDTHS)
def test_parse_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected, rel=1e-12)


def test_bandwidth_case_of_b_separates_bits_from_bytes():
    assert parse_bandwidth("8Gb/s") * 8 == pytest.approx(parse_bandwidth("8GB/s"))


DURATIONS = [
    ("0", 0.0),
    ("2", 2.0),
    ("50ns", 50e-9),
    ("50us", 50e-6),
    ("50µs", 50e-6),
    ("50μs", 50e-6),  # Greek mu
    ("0.5ms", 0.5e-3),
    ("200ms", 0.2),
    ("1s", 1.0),
    ("2.5s", 2.5),
    ("1min", 60.0),
    ("5 MS", 5e-3),
]


@pytest.mark.parametrize(("text", "expected"), DURATIONS)
def test_parse_duration(text, expected):
    assert parse_duration(text) == pytest.approx(expected, rel=1e-12, abs=0)


BAD = [
    (parse_size, "", "empty"),
    (parse_size, "   ", "empty"),
    (parse_size, "-1KB", ">= 0"),
    (parse_size, "4XB", "unknown"),
    (parse_size, "nan", "number"),
    (parse_size, "inf", "number"),
    (parse_size, "1e400GB", "finite"),
    (parse_size, "KB", "number"),
    (parse_size, "4 K B", "unknown"),
    (parse_bandwidth, "0Gbit", "> 0"),
    (parse_bandwidth, "-5Gbit", "> 0"),
    (parse_bandwidth, "10", "unit"),
    (parse_bandwidth, "10GB", "unknown"),
    (parse_bandwidth, "10Xbit", "unknown"),
    (parse_bandwidth, "nanGbit", "number"),
    (parse_bandwidth, "1e400bit", "finite"),
    (parse_bandwidth, "", "empty"),
    (parse_duration, "-1s", ">= 0"),
    (parse_duration, "3h", "unknown"),
    (parse_duration, "inf", "number"),
    (parse_duration, "1e400s", "finite"),
    (parse_duration, "ms", "number"),
    (parse_duration, "", "empty"),
]


@pytest.mark.parametrize(("fn", "text", "reason"), BAD)
def test_rejects_with_one_line_naming_value(fn, text, reason):
    with pytest.raises(ValueError) as info:
        fn(text)
    message = str(info.value)
    assert repr(text) in message
    assert reason in message
    assert "e.g." in message
    assert "\n" not in message


def test_error_message_matches_house_style():
    with pytest.raises(ValueError) as info:
        parse_bandwidth("0Gbit")
    assert str(info.value).startswith("--bandwidth '0Gbit': must be > 0; e.g. ")


def test_custom_flag_name_appears():
    with pytest.raises(ValueError, match=r"^--latency '-1ms'"):
        parse_duration("-1ms", flag="--latency")


def test_non_string_rejected():
    with pytest.raises(ValueError, match="string"):
        parse_size(4096)


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (4000, "4.00 KB"),
        (12_340_000, "12.3 MB"),
        (999_999, "1.00 MB"),
        (1.5e9, "1.50 GB"),
        (-2048, "-2.05 KB"),
    ],
)
def test_format_bytes(n, expected):
    assert format_bytes(n) == expected


@pytest.mark.parametrize(
    ("s", "expected"),
    [
        (0, "0 s"),
        (5e-5, "50.0 us"),
        (0.0123, "12.3 ms"),
        (0.9996, "1.00 s"),
        (2.5, "2.50 s"),
        (1234.0, "1234 s"),
        (3e-9, "3.00 ns"),
    ],
)
def test_format_seconds(s, expected):
    assert format_seconds(s) == expected


def test_format_non_finite_does_not_raise():
    assert "inf" in format_seconds(math.inf)
    assert "nan" in format_bytes(math.nan)


def test_size_round_trips_through_format_within_three_digits():
    for n in (1, 999, 4096, 10**6 + 1, 7 * 10**9):
        text = format_bytes(n).replace(" ", "")
        assert parse_size(text) == pytest.approx(n, rel=5e-3)
