"""Write notebooks/analysis.ipynb (outputs-free) from the cells below.

    python notebooks/make_notebook.py

The notebook is generated so that it stays reviewable and reproducible: edit this script, not
the .ipynb, and rerun it. Cell ids are fixed so regenerating an unchanged script changes no
byte. The notebook only reads a sweep folder; it never trains.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

INTRO = """\
# Sweep analysis

Reads one sweep folder written by `python -m testbed.sweep` (`runs.parquet` plus the run
folders it points to) and draws the figures of `testbed.analysis.plots`. It never trains: run a sweep
first, e.g. `python -m testbed.sweep experiments/scaling.toml`. Column meanings and units are
in `results/README.md`."""

PARAMETERS = """\
SWEEP_DIR = "results/sweeps/scaling"  # relative to the repository root, or absolute"""

SETUP = """\
import io
import sys
from pathlib import Path

from IPython.display import Image, display

# Jupyter starts in notebooks/; relative paths are read from the repository root.
ROOT = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from testbed.analysis import plots  # noqa: E402
from testbed.sweep import load_table, run_tables  # noqa: E402

sweep_dir = Path(SWEEP_DIR) if Path(SWEEP_DIR).is_absolute() else ROOT / SWEEP_DIR


def show(make, *args):
    \"\"\"Draw one figure inline, or say why the data does not support it.\"\"\"
    try:
        fig = make(*args)
    except plots.NoData as exc:
        print(f"{make.__name__}: nothing to draw ({exc})")
        return
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    display(Image(buf.getvalue()))"""

LOAD = """\
table = load_table(sweep_dir)
print(f"{sweep_dir}: {len(table)} runs, grid {table.attrs.get('sweep', {}).get('grid')}")
cols = ["strategy", "workers", "repeat", "status", "samples_per_s", "step_time_mean_s",
        "compute_frac", "comm_frac", "wait_frac", "loss_last"]
table[[c for c in cols if c in table.columns]]"""

FAILED = """\
table.loc[table["status"] != "completed", ["point_id", "strategy", "workers", "error"]]"""

PER_RUN = """\
steps = run_tables(table, "steps")      # {series label: steps.parquet of repeat 0}
updates = run_tables(table, "updates")  # {series label: updates.parquet of repeat 0}"""

FIGURES = [
    ("show(plots.throughput_vs_workers, table)",
     "Throughput in samples/s against the number of workers, with each series' ideal linear "
     "scaling from its smallest N (dashed), and the same as scaling efficiency (% of ideal)."),
    ("show(plots.step_breakdown, table)",
     "Mean time per model update for each strategy and N, split by the share of worker time "
     "spent computing (including injected straggler delay), communicating and waiting."),
    ("show(plots.measured_vs_predicted, table)",
     "Measured communication per step against the alpha-beta cost model's prediction (emulated "
     "network only); points on the dashed y = x line mean the model explains the measurement."),
    ("show(plots.straggler_impact, table)",
     "Mean step time under each injected straggler setting (`straggler` column), per strategy "
     "variant: how much of a slow or jittery worker each variant absorbs."),
    ("show(plots.staleness_histogram, steps)",
     "How stale the applied gradients were (server versions between read and apply); "
     "synchronous strategies sit at 0, an SSP bound s caps the distribution at s."),
    ("show(plots.loss_vs_updates, updates)",
     "Training loss after each model update: what staleness or dropped gradients cost per update."),
    ("show(plots.loss_vs_time, updates)",
     "Training loss against wall time since the first update (time-to-loss): faster updates "
     "can win even when each update helps less."),
    ("show(plots.convergence_vs_time, table)",
     "Accuracy per second: the held-out loss of each run's authoritative model against training "
     "wall time, one panel per setting (workload, straggler, network), with the run's target and, "
     "for the generated language, the best achievable loss (its entropy). `experiments/"
     "convergence.toml` is the sweep this section is written for."),
    ("show(plots.convergence_vs_samples, table)",
     "The same against samples seen, in global batches (one model update of a synchronous "
     "strategy): statistical efficiency alone. An asynchronous or stale run that is below the "
     "others in time but above them here trades sample efficiency for speed."),
    ("from IPython.display import Markdown\n\ntry:\n    display(Markdown(plots.time_to_target_table(table)))\n"
     "except plots.NoData as exc:\n    print(f\"no evaluated runs ({exc})\")",
     "Time, updates and samples to the target (`--target-loss` / `--target-acc`), fastest first "
     "per setting, beside the last held-out loss and the throughput: what `time_to_target.md` in "
     "the sweep's figures folder holds."),
]


def build() -> nbformat.NotebookNode:
    """Return the notebook, outputs-free, with fixed cell ids."""
    cells = [new_markdown_cell(INTRO), new_code_cell(PARAMETERS, metadata={"tags": ["parameters"]}),
             new_code_cell(SETUP), new_code_cell(LOAD),
             new_markdown_cell("The runs of the sweep, one row each (repeats are separate rows)."),
             new_code_cell(FAILED),
             new_markdown_cell("Runs that did not complete, with the one-line reason."),
             new_code_cell(PER_RUN)]
    for code, text in FIGURES:
        cells += [new_code_cell(code), new_markdown_cell(text)]
    for i, cell in enumerate(cells):
        cell["id"] = f"cell-{i:02d}"
    return new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    })


def main() -> None:
    nb = build()
    nbformat.validate(nb)
    nbformat.write(nb, HERE / "analysis.ipynb")


if __name__ == "__main__":
    main()
