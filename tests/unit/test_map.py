"""python -m testbed.map, without Ray: the ranking on hand-made tables, the configurations the
strategies offer, the choice of check cells, the verdict of a check, and bad input (one line,
exit 2, before Ray). The directions the shipped map must show: test_map_directions.py."""

import math
import subprocess
import sys
import time

import pandas as pd
import pytest

from testbed.config import RunConfig, with_overrides
from testbed.map import accuracy, report, spotchecks
from testbed.map.grid import parse_grid
from testbed.map.rank import CELL, rank
from testbed.map.table import configurations, predictions
from testbed.strategies.registry import SPECS
from testbed.workloads import tensor_plan

FAST_S = 20  # far less than a Ray start and a check run


def _table(scores, families, compute=1.0, cell=("50us", "10Gbit", 8)):
    rows = [dict(zip(CELL, cell, strict=True), label=f"c{i}", strategy=f"s{i}", family=f,
                 compute_s=compute, predicted_step_s=s if s == s else compute * 2, score_s=s)
            for i, (s, f) in enumerate(zip(scores, families, strict=True))]
    return pd.DataFrame(rows)


def test_the_winner_is_the_lowest_score_and_margins_are_ratios():
    scores, families = [3.0, 1.5, 2.0, 4.0], ["a", "b", "b", "a"]
    rows, cells = rank(_table(scores, families))
    cell = cells.iloc[0]
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    assert cell["winner"] == f"c{order[0]}" and cell["runner_up"] == f"c{order[1]}"
    assert cell["margin_runner_up"] == pytest.approx(scores[order[1]] / scores[order[0]] - 1)
    other = min(s for s, f in zip(scores, families, strict=True) if f != families[order[0]])
    assert cell["other_family"] != cell["winner_family"]
    assert cell["margin_other"] == pytest.approx(other / scores[order[0]] - 1)
    assert list(rows.sort_values("rank")["label"]) == [f"c{i}" for i in order]
    assert (rows["efficiency"] == rows["compute_s"] / rows["predicted_step_s"]).all()
    assert not cell["tied"]


def test_ties_share_a_rank_and_a_zero_margin_and_the_label_decides_the_order():
    scores = [2.0, 1.0, 1.0, 3.0]
    rows, cells = rank(_table(scores, ["a", "a", "b", "b"]))
    cell = cells.iloc[0]
    assert cell["tied"] and cell["margin_runner_up"] == 0.0 and cell["margin_other"] == 0.0
    assert (cell["winner"], cell["runner_up"]) == ("c1", "c2")  # equal scores: by label
    tied = rows[rows["score_s"] == min(scores)]
    assert set(tied["rank"]) == {1.0}
    assert rows.loc[rows["label"] == "c0", "rank"].item() == 1 + len(tied)  # competition ranking


def test_rows_without_a_score_are_listed_not_ranked():
    rows, cells = rank(_table([float("nan"), 2.0], ["a", "b"]))
    assert math.isnan(rows.loc[rows["label"] == "c0", "rank"].item())
    cell = cells.iloc[0]
    assert cell["winner"] == "c1" and cell["runner_up"] is None and cell["other"] is None


def test_cells_rank_apart():
    a, b = _table([1.0, 2.0], ["a", "b"], cell=("50us", "1Gbit", 4)), _table([2.0, 1.0], ["a", "b"])
    _, cells = rank(pd.concat([a, b], ignore_index=True))
    assert list(cells["winner"]) == ["c0", "c1"]


def test_every_strategy_offers_configurations_that_validate_and_plan():
    base = parse_grid(workload="profile:resnet50", workers="8", bandwidth="10Gbit", latency="50us",
                      compute_ms=100, node_size=4).base()
    sizes, shares = tensor_plan(base.workload, seed=base.seed)
    found = configurations(base, 8, node_size=4)
    assert {c.spec.name for c in found} == set(SPECS)
    assert all(c.config is not None for c in found), [c.refused for c in found if c.config is None]
    labels = [c.variant.label for c in found]
    assert len(labels) == len(set(labels))
    for c in found:
        plan = c.spec.plan(c.config, sizes, shares)
        assert plan["grad_bytes_logical"] == 4 * sum(sizes)
        if "bucket_bytes_logical" in plan:  # the allreduce's buckets cover the gradient once
            assert sum(plan["bucket_bytes_logical"]) == plan["grad_bytes_logical"]
            assert sum(plan["bucket_backward_share"]) == pytest.approx(1.0)


def test_check_cells_are_nearest_and_farthest_from_a_crossover():
    margins = [0.5, 0.01, 0.2, 0.9, 0.05, None, 0.3, 0.02]
    cells = pd.DataFrame({"latency": "50us", "bandwidth": "10Gbit", "workers": range(len(margins)),
                          "margin_other": margins})
    k = 4
    hosted = {i for i, m in enumerate(margins) if m is not None and i != 1}  # the smallest margin cannot be hosted
    chosen, left = spotchecks.select(cells, k, _pairs_of(cells, hosted, set(), "cannot"))
    known = sorted((margins[i], i) for i in hosted)
    near = [i for _, i in known[:k - k // 4]]
    far = [i for _, i in known[-(k // 4):]]
    assert list(chosen["workers"]) == near + far
    assert list(chosen["chosen"]) == ["near a crossover"] * len(near) + ["far from one"] * len(far)
    assert left == {"cannot": len(margins) - len(hosted)}


def _judged(summary, predicted=1.0, status="completed"):
    cfg = with_overrides(RunConfig(), strategy=next(n for n, s in SPECS.items() if s.synchronous(RunConfig(strategy=n))))
    return spotchecks.judge(cfg, predicted, summary, status, None)


def test_a_check_is_ok_within_tolerance_and_off_with_its_reason_beyond():
    inside = 1 + spotchecks.TOLERANCE / 2
    ok = _judged({"step_time_p50_s": inside, "predicted_step_s": 1.0, "emulation_leak_frac": 0.0})
    assert ok["verdict"] == "ok" and ok["ratio"] == pytest.approx(inside)
    outside = 1 + 2 * spotchecks.TOLERANCE
    off = _judged({"step_time_p50_s": outside, "predicted_step_s": 1.0, "emulation_leak_frac": 0.0})
    assert off["verdict"] == "off" and f"{outside:.2f}x" in off["reason"]
    searched = "not faithful: at --dilation 30 a trial measured 1.2x the model's communication; ..."
    late = _judged({"step_time_p50_s": 1 - 2 * spotchecks.TOLERANCE, "predicted_step_s": 1.0,
                    "emulation_leak_frac": 2 * spotchecks.LEAK_LIMIT, "dilation_search_result": searched})
    assert late["verdict"] == "off" and "not faithful: the emulator ran late" in late["reason"]
    assert late["reason"].endswith(f"the dilation search: {searched}")  # why more dilation was not bought
    busy = _judged({"step_time_p50_s": outside, "predicted_step_s": 1.0, "foreign_cpu_share": 0.4})
    assert busy["reason"].endswith("other processes used 40% of this machine's CPUs during the check; rerun it when quiet")
    assert _judged({"step_time_p50_s": 1.0, "predicted_step_s": 1.0, "foreign_cpu_share": 0.4})["verdict"] == "ok"
    failed = _judged(None, status="failed")
    assert failed["verdict"] == "off" and "failed" in failed["reason"]
    other = _judged({"step_time_p50_s": 1.0, "predicted_step_s": 1.5, "emulation_leak_frac": 0.0})
    assert other["verdict"] == "off" and "plans differ" in other["reason"]


def test_sentences_group_worker_counts_with_one_winner():
    cells = pd.DataFrame({"workers": [8, 16, 32], "winner": ["x", "x", "y"], "runner_up": ["y", "y", "x"],
                          "margin_runner_up": [0.1, 0.2, 0.05], "tied": False, "other": ["y", "y", "x"],
                          "margin_other": [0.1, 0.2, 0.05]})
    text = report.sentence("10Gbit", "50us", cells)
    assert "up to N = 16 **x** wins by 10-20%" in text and "at N = 32 **y** wins by 5%" in text


@pytest.mark.parametrize(("args", "needle"), [
    (["--workload", "profile:nope"], "'profile:nope'"),
    (["--workload", "mlp"], "'mlp'"),
    (["--workers", ""], "--workers ''"),
    (["--workers", "0,8"], "--workers 0"),
    (["--workers", "8,,16"], "--workers '8,,16'"),
    (["--bandwidth", "0Gbit"], "'0Gbit'"),
    (["--bandwidth", "fast"], "'fast'"),
    (["--latency", "soon"], "'soon'"),
    (["--check-cells", "-1"], "--check-cells -1"),
    (["--compute-ms", "-5"], "--compute-ms -5"),
    (["--calibration", "/nonexistent.json"], "--calibration"),
    (["--target-loss", "0"], "--target-loss 0"),
    (["--accuracy-workload", "profile:resnet50"], "--accuracy-workload 'profile:resnet50'"),
])
def test_bad_input_exits_2_with_one_line_before_ray(tmp_path, args, needle):
    argv = {"--workload": "profile:resnet50", "--workers": "8,16", "--bandwidth": "1Gbit,10Gbit"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        argv[flag] = value
    cmd = [sys.executable, "-m", "testbed.map", *[x for kv in argv.items() for x in kv], "--out", str(tmp_path / "m")]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("testbed.map: error:") and needle in lines[0], out.stderr
    assert time.monotonic() - t0 < FAST_S and not (tmp_path / "m").exists()


def _pairs_of(cells, top, fill, why):
    """pairs(cell) for spotchecks.select from sets of worker counts: top -> the winner pair, fill ->
    another pair with a note, anything else -> the reason."""
    def pairs(c):
        n = int(c["workers"])
        if n in top:
            return ("w", "r"), None
        if n in fill:
            return ("r", "t"), f"w needs more processes at N = {n}"
        return why
    return pairs


def test_check_cells_fill_with_other_pairs_so_that_k_run_where_k_can():
    margins = [0.5, 0.01, 0.2, 0.9, 0.05, 0.3, 0.02, 0.4]
    cells = pd.DataFrame({"latency": "50us", "bandwidth": "10Gbit", "workers": range(len(margins)),
                          "margin_other": margins})
    top, fill = {0, 2, 3}, {1, 4}
    why = "too many workers"
    k = len(top) + len(fill)
    chosen, left = spotchecks.select(cells, k, _pairs_of(cells, top, fill, why))
    assert len(chosen) == k and set(chosen["workers"]) == top | fill
    assert left == {why: len(margins) - len(top) - len(fill)}
    filled = chosen[chosen["chosen"].str.startswith("fill")]
    assert set(filled["workers"]) == fill and all(r == ("r", "t") for r in filled["runs"])
    assert all("needs more processes" in c for c in filled["chosen"])
    # asked for fewer: the winner pairs come first, the fill only makes up a shortfall
    few, _ = spotchecks.select(cells, len(top), _pairs_of(cells, top, fill, why))
    assert set(few["workers"]) == top and not few["chosen"].str.startswith("fill").any()
    # asked for more than can run: every eligible cell, once
    more, _ = spotchecks.select(cells, len(margins) + 1, _pairs_of(cells, top, fill, why))
    assert sorted(more["workers"]) == sorted(top | fill)


def test_the_report_says_how_many_checks_were_asked_ran_and_why_others_did_not():
    why = "more than 16 workers, too slow to run here"
    asked, ran, cant = 8, 5, 12
    text = report.selection_text({"asked": asked, "chosen": ran, "left": {why: cant}})
    assert f"{asked} cells asked" in text and f"{ran} checked" in text
    assert f"{asked - ran} left out" in text and f"{cant} cells: {why}" in text
    full = report.selection_text({"asked": asked, "chosen": asked, "left": {why: cant}})
    assert "left out" not in full


def _stale_table(steps, exact, kinds):
    return pd.DataFrame([dict(latency="50us", bandwidth="10Gbit", workers=8, label=f"c{i}", strategy=f"s{i}",
                              family=f"f{i}", compute_s=min(steps), predicted_step_s=s, exact=e, kind=kd)
                         for i, (s, e, kd) in enumerate(zip(steps, exact, kinds, strict=True))])


def test_a_measured_factor_multiplies_the_step_of_its_kind_and_can_change_the_winner():
    steps = [1.0, 0.6, 0.7, 0.8]  # the stale ones step faster than the synchronous one
    exact, kinds = [True, False, False, False], ["sync", "a", "a", "b"]
    preds = _stale_table(steps, exact, kinds)
    slow, fast = steps[0] / steps[1] * 2, 1.0  # kind a: twice the sync's time to the target; b: as many samples
    measured = {"a": {"factor": slow}, "b": {"factor": fast}}
    scored = accuracy.apply(preds, measured)
    for i, (s, kd) in enumerate(zip(steps, kinds, strict=True)):
        want = s * (1.0 if exact[i] else measured[kd]["factor"])
        assert scored.loc[i, "score_s"] == pytest.approx(want)
    _, cells = rank(scored)
    assert cells.iloc[0]["winner"] == "c3"  # kind b: as many samples, a faster step
    # unmeasured (no --target-loss, or no factor): stale rows have no score and the sync one wins
    _, plain = rank(accuracy.apply(preds, None))
    assert plain.iloc[0]["winner"] == "c0" and plain.iloc[0]["runner_up"] is None
    partial = accuracy.apply(preds, {"a": {"factor": None}, "b": {"factor": fast}})
    assert partial.loc[[1, 2], "score_s"].isna().all() and partial.loc[3, "score_s"] == pytest.approx(steps[3])


def test_factors_are_samples_over_the_reference_and_say_why_when_unknown():
    ref, budget = 640, 2560
    recs = {"reference": {"status": "completed", "samples_to_target": ref, "samples_budget": budget},
            "a": {"status": "completed", "samples_to_target": 2 * ref, "samples_budget": budget},
            "b": {"status": "completed", "samples_to_target": None, "samples_budget": budget},
            "c": {"status": "failed", "error": "RuntimeError: x", "samples_to_target": None}}
    f = accuracy.factors(recs)
    assert f["a"]["factor"] == pytest.approx(2.0) and f["a"]["reason"] is None
    assert f["b"]["factor"] is None and f"not reached within {budget} samples" in f["b"]["reason"]
    assert f["c"]["factor"] is None and "failed" in f["c"]["reason"] and "RuntimeError" in f["c"]["reason"]
    missed = accuracy.factors({**recs, "reference": {**recs["reference"], "samples_to_target": None}})
    assert all(m["factor"] is None and "synchronous reference" in m["reason"] for m in missed.values())


def test_the_report_says_what_the_ranking_used_and_each_factor_with_its_n():
    plain = " ".join(accuracy.section(None, None, None, None))
    assert "predicted step time" in plain and "not ranked" in plain
    target, factor = 0.05, 1.25
    measured = accuracy.factors({"reference": {"status": "completed", "samples_to_target": 400},
                                 "ps kind": {"status": "completed", "samples_to_target": 400 * factor}})
    text = "\n".join(accuracy.section(target, "mlp", measured, "ring x"))
    assert f"held-out loss {target:g}" in text and "`mlp`" in text and "ring x" in text
    row = next(line for line in text.splitlines() if line.startswith("| ps kind"))
    assert f"| {accuracy.ACC_WORKERS} |" in row and f"{factor:.2f}" in row


def test_every_stale_configuration_has_a_kind_and_the_kinds_are_few():
    grid = parse_grid(workload="profile:resnet50", workers="8,64", bandwidth="10Gbit", latency="50us",
                      compute_ms=100)
    preds = predictions(grid)
    stale = preds[~preds["exact"].astype(bool)]
    found = accuracy.kinds(preds)
    assert set(found["kind"]) == set(stale["kind"]) and found["kind"].is_unique
    assert len(found) < stale["label"].nunique()  # variants that only move bytes elsewhere share one run


def test_the_committed_notebook_shows_the_shipped_map_and_its_answer():
    """notebooks/analysis.ipynb's last section, executed on the shipped map (docs/map.md): the
    figure, and the winner table that answer_table makes of that folder's map.parquet."""
    import importlib.util
    from pathlib import Path

    import nbformat

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("make_notebook", root / "notebooks" / "make_notebook.py")
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    cells = {c.source: c for c in nbformat.read(root / "notebooks" / "analysis.ipynb", as_version=4).cells
             if c.cell_type == "code"}
    for code, _, mime in mk.MAP_FIGURES:
        assert [o for o in cells[code].outputs if mime in o.get("data", {})], code
    shown = "".join(o["data"].get("text/markdown", "") for c in cells.values() for o in c.outputs if "data" in o)
    assert report.answer_table(pd.read_parquet(root / mk.MAP / "map.parquet")) in shown


def test_an_asynchronous_check_runs_every_worker_and_measures_n_mean_intervals():
    """An asynchronous update is one worker's gradient: a check runs STEPS iterations of every
    worker (STEPS x N updates), and its step is N times the mean interval (bursts make the median
    small), where a synchronous step is the median interval."""
    n = 8
    name = next(s for s, spec in SPECS.items() if not spec.synchronous(RunConfig(strategy=s, workers=n)))
    cfg = with_overrides(RunConfig(), strategy=name, workers=n)
    assert spotchecks.check_config(cfg, 1.0, 2**30, spotchecks.Path("/tmp")).steps == spotchecks.STEPS * n
    mean, p50 = 1.0 / n, 0.1 / n
    judged = spotchecks.judge(cfg, 1.0, {"step_time_p50_s": p50, "step_time_mean_s": mean}, "completed", None)
    assert judged["measured_step_s"] == pytest.approx(mean * n) and judged["verdict"] == "ok"
    sync = _judged({"step_time_p50_s": 1.0, "step_time_mean_s": 2.0, "predicted_step_s": 1.0})
    assert sync["measured_step_s"] == pytest.approx(1.0)


def test_with_a_target_the_report_also_says_the_synchronous_answer():
    cells = pd.DataFrame({"latency": "50us", "bandwidth": "10Gbit", "workers": [8], "winner": ["stale"],
                          "runner_up": ["sync"], "margin_runner_up": [0.1], "tied": False, "other": [None],
                          "margin_other": [None]})
    sync = cells.assign(winner=["sync"], runner_up=[None], margin_runner_up=[None])
    empty = pd.DataFrame(columns=["verdict"])
    both = report.markdown("t", "cmd", cells, cells, empty, "x", [], sync_cells=sync)
    alone = both[both.index("## Synchronous steps alone"):]
    assert "**stale**" in both[:both.index("## Synchronous steps alone")] and "**sync**" in alone
    assert "## Synchronous steps alone" not in report.markdown("t", "cmd", cells, cells, empty, "x", [])


def test_a_check_starts_where_its_dilated_step_lasts_about_a_second_faster_than_real_time_if_long():
    """A 0.35 s step starts at D = 3 (1.05 s); a 1.5 s step at 0.67 (1.0 s), faster than real
    time; a step of minutes at --dilation's floor, 0.01; a very short one at MAX_DILATION."""
    from testbed.config.environment import MIN_DILATION

    assert spotchecks.dilation_for(0.35) == 3.0 and spotchecks.dilation_for(1.0) == 1.0
    assert spotchecks.dilation_for(1.5) == 0.67
    assert spotchecks.dilation_for(130.0) == MIN_DILATION == 0.01
    assert spotchecks.dilation_for(1e-6) == spotchecks.MAX_DILATION
