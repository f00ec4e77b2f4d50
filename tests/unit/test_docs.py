"""results/README.md's key tables are generated from one source, current, and complete."""

import pandas as pd

from testbed import docs
from testbed.analysis.keys import EVENT_COLUMNS, STEP_COLUMNS, UPDATE_COLUMNS, documented
from testbed.config import RunConfig, with_overrides
from testbed.records import EVENT_COLUMNS as EVENTS
from testbed.records import STEP_COLUMNS as STEPS
from testbed.records import UPDATE_COLUMNS as UPDATES
from testbed.registry import SPECS
from testbed.session import summarize_run


def test_results_readme_tables_are_current():
    current, fresh = docs.rendered()
    assert current == fresh, "results/README.md is out of date: run python -m testbed.docs"


def test_every_record_column_is_documented():
    assert tuple(STEP_COLUMNS) == STEPS
    assert tuple(UPDATE_COLUMNS) == UPDATES
    assert tuple(EVENT_COLUMNS) == EVENTS


def _records(n=2, steps=3):
    rows = [{"run_id": "r", "strategy": "ps-sync", "worker": w, "iteration": i, "version_read": i,
             "version_applied": i, "t_start": 10.0 + i, "compute_s": 0.1, "comm_s": 0.2, "wait_s": 0.0,
             "bytes_sent": 100, "bytes_recv": 100, "samples": 8, "loss": 1.0, "staleness": 0,
             "injected_delay_s": 0.0, "late_s": 0.0} for i in range(steps) for w in range(n)]
    ups = [{"version": i + 1, "t_applied": 10.5 + i, "contributors": n, "dropped": 0, "loss": 1.0}
           for i in range(steps)]
    return pd.DataFrame(rows), pd.DataFrame(ups)


def test_every_key_a_summary_can_have_is_documented():
    steps, updates = _records()
    extra = {"grad_bytes_logical": 4096, "faults": []}
    for net in ({}, {"network.bandwidth": "1Gbit"}):
        for name, spec in SPECS.items():
            if name == "allreduce-torch" and net:
                continue
            cfg = with_overrides(RunConfig(strategy=name, workers=2), **net)
            own = {k: 1 for k in spec.summary_keys if k != "grad_bytes_logical"}
            summary = summarize_run(spec, cfg, steps, updates, {**own, **extra}, "completed")
            summary.update(run_id="r", elapsed_s=1.0, startup_s=0.1, schema_version=1)
            missing = set(summary) - documented(SPECS)
            assert not missing, f"{name}: undocumented summary keys {sorted(missing)}"
    empty = summarize_run(SPECS["ring"], RunConfig(), steps.iloc[:0], updates.iloc[:0], {}, "failed")
    assert set(empty) <= documented(SPECS)
