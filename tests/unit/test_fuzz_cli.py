"""Hostile input: every argv either parses into a valid config or fails with ConfigError.

Never a traceback of another kind, and the message is always one line (the CLI prints it as
`testbed.run: error: ...` with exit code 2 before Ray starts).
"""

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.config import ConfigError, parse_config
from testbed.strategies.registry import SPECS

FLAGS = ["--strategy", "--workers", "--steps", "--workload", "--batch-size", "--lr", "--seed",
         "--device", "--grad-mb", "--compute-ms", "--payload", "--placement", "--timeout", "--out",
         "--straggler", "--ps-shards", "--staleness-bound", "--backup-workers", "--bucket-mb",
         "--transport", "--bandwidth", "--latency", "--fail", "--max-restarts",
         "--checkpoint-every", "--on-nan", "--cpus-per-worker"]
VALUES = st.one_of(
    st.integers(-10**6, 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "-1", "0", "1e9", "100000", "10Gbit", "0Gbit", "5 parsecs",
                     "fixed:worker=99,delay=1s", "scaled:0", "scaled:0.5", "worker=1,at=2",
                     "hang:server=0,at=1", "ring", "ps-sync", "synthetic", "", "/dev/null",
                     "random:dist=lognormal,sigma=0.5", "none", "50us", "-5ms", "µs"]),
    st.text(max_size=12),
)
ARGV = st.lists(st.tuples(st.sampled_from(FLAGS), VALUES), max_size=6).map(
    lambda pairs: [tok for flag, value in pairs for tok in (flag, value)])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ARGV)
def test_every_argv_parses_or_fails_with_one_line(argv):
    try:
        cfg = parse_config(argv, SPECS)
    except ConfigError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg and "Traceback" not in msg
        return
    assert 1 <= cfg.workers <= 4096 and cfg.steps >= 1
    assert math.isfinite(cfg.workload.learning_rate) and cfg.workload.learning_rate > 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=20), max_size=6))
def test_arbitrary_tokens_never_crash(argv):
    try:
        parse_config(argv, SPECS)
    except ConfigError as exc:
        assert "\n" not in str(exc)
