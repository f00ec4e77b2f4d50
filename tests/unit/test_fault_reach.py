"""A --fail item that cannot fire: refused before Ray when `at` lies beyond the run, recorded as
`fault-not-reached` when only the run can tell (an asynchronous worker's share of --steps)."""

from __future__ import annotations

import pytest

from testbed.config.faultspec import check_faults, parse_faults
from testbed.emulation.faults import not_reached
from tests.unit.test_cli_errors import FAST_S, run_cli

STEPS = 5


@pytest.mark.parametrize(("strategy", "fail"), [
    ("mapreduce", f"worker=1,at={STEPS * 100}"),
    ("ring", f"nan:worker=0,at={STEPS}"),
    ("ps-sync", f"server=0,at={STEPS}"),
    ("ps-async", f"hang:worker=1,at={STEPS + 1}"),
])
def test_a_fault_beyond_the_run_is_refused_before_ray(tmp_path, strategy, fail):
    code, out, err, took = run_cli(["--strategy", strategy, "--workers", "2", "--steps", str(STEPS),
                                    "--fail", fail, "--out", str(tmp_path / "out")], tmp_path)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert repr(fail) in lines[0] and f"--steps {STEPS}" in lines[0] and f"0..{STEPS - 1}" in lines[0]
    assert "never fire" in lines[0] and "raise --steps" in lines[0]
    assert took < FAST_S and not (tmp_path / "out").exists() and not out


def test_the_last_iteration_and_version_of_the_run_are_accepted():
    check_faults(parse_faults(f"worker=1,at={STEPS - 1};server=0,at={STEPS - 1}"), workers=2, servers=1,
                 steps=STEPS)


def _steps(per_worker):
    return [{"worker": w, "iteration": i} for w, n in per_worker.items() for i in range(n)]


def test_a_worker_that_never_got_to_at_is_named_with_how_far_it_got():
    made = {0: 3 * STEPS, 1: STEPS}  # worker 1 made its share of an asynchronous run, no more
    faults = parse_faults(f"worker=1,at={STEPS};nan:worker=0,at={STEPS}")
    missed = not_reached(faults, _steps(made), [{"version": v} for v in range(1, 4 * STEPS + 1)], [])
    assert [f for f, _ in missed] == [faults[0]]
    line = missed[0][1]
    assert repr(faults[0].to_text()) in line and f"iterations 0..{STEPS - 1}" in line and "\n" not in line


def test_a_fault_that_fired_is_never_called_unreached():
    faults = parse_faults(f"worker=1,at={STEPS}")
    # the worker died at `at` and restarts ran out: no record of that iteration, only the fault's
    fired = [{"kind": "worker-restart", "actor": "worker1", "iteration": STEPS}]
    assert not_reached(faults, _steps({1: STEPS}), [], fired) == []
    assert not_reached(faults, _steps({1: STEPS + 1}), [], []) == []


def test_a_server_fault_past_the_last_applied_version_is_unreached():
    faults = parse_faults(f"server=0,at={STEPS}")
    updates = [{"version": v} for v in range(1, STEPS + 1)]
    missed = not_reached(faults, [], updates, [])
    assert len(missed) == 1 and f"versions up to {STEPS}" in missed[0][1]
    assert not_reached(faults, [], updates + [{"version": STEPS + 1}], []) == []
