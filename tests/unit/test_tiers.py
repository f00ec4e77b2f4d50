"""The suite's halves (tests/conftest.py): every file of the Ray tier is in exactly one group."""

from pathlib import Path

from tests.conftest import BATCH_GROUP, RAY_GROUPS

RAY = Path(__file__).resolve().parents[1] / "ray"


def test_every_ray_test_file_is_in_exactly_one_group():
    files = sorted(p.stem for p in RAY.glob("test_*.py"))
    grouped = [f for group in RAY_GROUPS.values() for f in group]
    assert sorted(grouped) == files, (set(files) ^ set(grouped), "RAY_GROUPS must list each file once")


def test_the_reliability_batch_starts_with_its_own_group():
    assert "test_reliability" in RAY_GROUPS[BATCH_GROUP]
