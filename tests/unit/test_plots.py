"""Every figure of testbed.analysis.plots on literal tables: PNG + SVG written, non-empty; gaps skipped."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from testbed.analysis import plots


def sweep_table() -> pd.DataFrame:
    rows = []
    for strategy, base in (("ring", 900.0), ("ps-sync", 700.0)):
        for n in (1, 2, 4):
            for straggler in ("none", "fixed:worker=0,delay=50ms"):
                for repeat in (0, 1):
                    step = 0.01 * (1 + 0.1 * n) + (0.05 if straggler != "none" else 0.0)
                    rows.append({
                        "strategy": strategy, "workers": n, "repeat": repeat, "status": "completed",
                        "straggler": straggler, "steps": 10, "workload.name": "synthetic",
                        "workload.grad_mb": 4.0, "network.bandwidth": "1Gbit", "network.latency": "50us",
                        "ring.bucket_mb": 25.0, "ps.shards": 1, "seed": 0,
                        "samples_per_s": base * n / (1 + 0.1 * n) * (1 + 0.01 * repeat),
                        "step_time_mean_s": step, "compute_frac": 0.5, "comm_frac": 0.3,
                        "wait_frac": 0.2, "comm_s_per_step": 0.003 * n,
                        "predicted_comm_s": 0.0025 * n if strategy == "ring" else np.nan,
                    })
    rows.append({**rows[0], "status": "failed", "samples_per_s": np.nan, "point_id": "x"})
    return pd.DataFrame(rows)


def steps_tables() -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(0)
    out = {}
    for label, bound in (("ps-async", 6), ("ps-async staleness_bound=2", 2)):
        st = rng.integers(0, bound + 1, size=200)
        applied = np.where(rng.random(200) < 0.05, -1, st + 10)
        out[label] = pd.DataFrame({"staleness": st, "version_applied": applied})
    return out


def updates_tables() -> dict[str, pd.DataFrame]:
    out = {}
    for label, rate in (("ring N=2", 0.1), ("ps-async", 0.05)):
        v = np.arange(1, 51)
        out[label] = pd.DataFrame({"version": v, "t_applied": 1e9 + 0.02 * v,
                                   "loss": np.exp(-rate * v), "contributors": 2, "dropped": 0})
    return out


def check_saved(fig, tmp_path, stem):
    paths = plots.save(fig, tmp_path / stem)
    assert [p.suffix for p in paths] == [".png", ".svg"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in paths[1].read_bytes()[:2000]
    assert all(p.stat().st_size > 1000 for p in paths)
    assert not list(tmp_path.glob(".*tmp*"))


@pytest.mark.parametrize("make", [plots.throughput_vs_workers, plots.step_breakdown,
                                  plots.measured_vs_predicted, plots.straggler_impact])
def test_table_figures(tmp_path, make):
    fig = make(sweep_table())
    assert fig.axes and fig.axes[0].get_xlabel() and fig.axes[0].get_ylabel()
    check_saved(fig, tmp_path, make.__name__)


def test_titles_say_what_was_run():
    fig = plots.throughput_vs_workers(sweep_table())
    title = fig.get_suptitle()
    assert "N=1-4" in title and "synthetic" in title and "4 MiB" in title and "1Gbit" in title


def test_staleness_histogram(tmp_path):
    fig = plots.staleness_histogram(steps_tables())
    assert "staleness" in fig.axes[0].get_xlabel()
    check_saved(fig, tmp_path, "staleness")


@pytest.mark.parametrize("make", [plots.loss_vs_updates, plots.loss_vs_time])
def test_loss_figures(tmp_path, make):
    fig = make(updates_tables())
    check_saved(fig, tmp_path, make.__name__)


def test_loss_vs_time_starts_at_first_update():
    fig = plots.loss_vs_time(updates_tables())
    x = fig.axes[0].get_lines()[0].get_xdata()
    assert x[0] == pytest.approx(0.0) and x[-1] == pytest.approx(0.98)


def test_series_are_split_only_by_keys_that_vary_within_a_strategy():
    table = pd.DataFrame({"strategy": ["ring", "ring", "mapreduce"], "workers": [2, 2, 2],
                          "ring.bucket_mb": [0.25, 1.0, 25.0], "seed": [0, 1, 0]})
    assert list(plots.series_labels(table)) == ["ring bucket_mb=0.25", "ring bucket_mb=1", "mapreduce"]
    table["workers"] = [1, 2, 4]
    assert list(plots.series_labels(table, exclude=()))[2] == "mapreduce"


def test_a_key_that_only_follows_n_splits_no_series():
    """The real workers a run chose for its size follow N: one series per strategy, its points
    named by N; a key with two values at one N still splits."""
    table = pd.DataFrame({"strategy": ["ring"] * 4, "workers": [8, 16, 64, 64],
                          "cluster.real_workers": [8, 16, 16, 16], "network.dilation": [1, 1, 1, 8]})
    assert list(plots.series_labels(table)) == ["ring dilation=1"] * 3 + ["ring dilation=8"]


@pytest.mark.parametrize("make", [plots.throughput_vs_workers, plots.step_breakdown,
                                  plots.measured_vs_predicted, plots.straggler_impact])
def test_missing_data_is_nodata(make):
    with pytest.raises(plots.NoData):
        make(pd.DataFrame({"strategy": ["ring"], "workers": [1], "status": ["completed"]}))
    all_nan = sweep_table().assign(samples_per_s=np.nan, step_time_mean_s=np.nan,
                                   predicted_comm_s=np.nan)
    with pytest.raises(plots.NoData):
        make(all_nan)


def test_per_run_figures_without_data_are_nodata():
    with pytest.raises(plots.NoData):
        plots.staleness_histogram({"x": pd.DataFrame({"loss": [1.0]})})
    with pytest.raises(plots.NoData):
        plots.loss_vs_updates({})


def test_figures_for_sweep_draws_what_the_data_supports(tmp_path):
    written = plots.figures_for_sweep(sweep_table(), tmp_path / "figs", steps_tables(), updates_tables())
    assert sorted(p.stem for p in written) == sorted([
        "throughput_vs_workers", "step_breakdown", "measured_vs_predicted", "straggler_impact",
        "staleness_histogram", "loss_vs_updates", "loss_vs_time"])
    assert all(p.with_suffix(".svg").exists() for p in written)
    few = sweep_table().drop(columns=["predicted_comm_s", "straggler"])
    few = few[few["workers"] == 2]
    names = {p.stem for p in plots.figures_for_sweep(few, tmp_path / "few")}
    assert names == {"step_breakdown"}
    assert plots.figures_for_sweep(pd.DataFrame(), tmp_path / "none") == []


def test_per_run_figures_live_in_runplots_and_stay_importable_from_plots():
    from testbed.analysis import runplots
    from testbed.analysis.plots import loss_vs_time, loss_vs_updates, staleness_histogram

    assert staleness_histogram is runplots.staleness_histogram
    assert (loss_vs_updates, loss_vs_time) == (runplots.loss_vs_updates, runplots.loss_vs_time)
    with pytest.raises(AttributeError):
        _ = plots.no_such_figure


def placement_table() -> pd.DataFrame:
    k_bytes, b = 100 * 2**20, 1.25e9
    rows = [{"strategy": "ring", "workers": 8, "status": "completed", "network.bandwidth": "10Gbit",
             "grad_bytes_logical": k_bytes, "ps_shards": np.nan, "comm_s_per_step": 0.151,
             "predicted_comm_s": 0.148}]
    for placement, shards in (("dedicated", (1, 2, 4, 8)), ("colocated", (8,))):
        for mb in (4.0, 0.0):
            for k in shards:
                t = 8 * k_bytes / (k * b) if placement == "dedicated" else 0.15
                rows.append({"strategy": "ps-sync", "workers": 8, "status": "completed",
                             "network.bandwidth": "10Gbit", "grad_bytes_logical": k_bytes, "ps_shards": k,
                             "ps.placement": placement, "ps.partition_mb": mb,
                             "comm_s_per_step": 1.05 * t, "predicted_comm_s": t})
    return pd.DataFrame(rows)


def test_placement_figure_draws_each_setting_the_ring_and_the_byteps_bound(tmp_path):
    from testbed.analysis.placement import placement_figure

    fig = placement_figure(placement_table())
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "BytePS bound t_opt(k)" in labels and "ring (measured)" in labels
    assert "ps-sync dedicated, 4 MiB partitions (measured)" in labels
    assert "ps-sync colocated, partitions off (model)" in labels
    assert (tmp_path / "placement.png") in plots.figures_for_sweep(placement_table(), tmp_path)


def test_placement_figure_needs_two_server_counts():
    from testbed.analysis.placement import placement_figure

    one_k = placement_table()
    one_k = one_k[one_k["ps_shards"].isna() | (one_k["ps_shards"] == 8)]
    with pytest.raises(plots.NoData, match="two or more server counts"):
        placement_figure(one_k)
