"""`python -m testbed.bench network` refuses message sizes the machine cannot hold before Ray
starts, as `bench allreduce` does (before: --sizes 4KiB,1TiB started Ray and a peer raised
MemoryError: a traceback, exit 1)."""

import pytest

from testbed.bench import calibrate
from testbed.bench.cli import main, parse_args
from testbed.config import ConfigError
from testbed.runtime.cluster import local_machine


def test_a_size_beyond_memory_is_one_line_exit_2(capsys):
    assert main(["network", "--sizes", "4KiB,1TiB"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--sizes '4KiB,1TiB'" in err and "use sizes up to" in err


def test_the_bound_is_the_copies_the_peers_hold():
    have = local_machine()["memory"]
    fits = int(have // calibrate.COPIES) // 4 * 4
    parse_args(["network", "--sizes", f"4KiB,{fits}B"])
    with pytest.raises(ConfigError, match="GiB for them"):
        parse_args(["network", "--sizes", f"4KiB,{fits + 4 * 2**20}B"])
