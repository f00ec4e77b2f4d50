"""A grid of runs from a TOML spec -> one tidy table + figures. Resumable.

    python -m testbed.sweep experiments/scaling.toml [--out results/sweeps] [--quiet]
    python -m testbed.sweep experiments/regression.toml --update-baseline [--baseline PATH]
    python -m testbed.sweep experiments/regression.toml --check [--baseline PATH]

Spec (keys are RunConfig field names; sub-configs as dotted keys or tables; `workload` alone
is the workload name; the string "none" is None for optional keys such as ps.staleness_bound):

    name = "scaling"                 # optional, defaults to the file stem
    repeats = 1
    [base]                           # applies to every point
    workload = "synthetic"
    "workload.grad_mb" = 4
    [grid]                           # cartesian product, in the order written
    strategy = ["ring"]              # any registered strategies
    workers = [1, 2, 4]

Several products in one sweep: write `[[grid]]` tables instead of one `[grid]`; the points are
the union of their products, in the order written (for example each strategy with its own
`network.dilation`, experiments/fidelity.toml).

Every point is validated before Ray starts (one stderr line naming the key and the fix, exit 2).
A strategy-specific key that a point's strategy does not read (its spec's `keys`: ps.* off the
parameter server, ring.* off the allreduce strategies, ...) is reset to its default for that
point; a combination that thereby repeats an earlier point is not run again but recorded as
"skipped" in points.jsonl (and left out of runs.parquet).

Each point x repeat runs through `testbed.session.execute`, exactly the single-run code path,
on one Ray instance shared by the whole sweep. Repeat r of every point runs before repeat r+1,
so slow drift of the machine does not bias one point; repeats keep the seed (grid over `seed`
for different data orders). Point ids hash the resolved config and the repeat index, and
`points.jsonl` gets a line as each point ends, so a rerun skips completed points and retries
failed or interrupted ones. Exit code: 0 all completed, 1 some failed, 2 bad spec, 130 Ctrl-C.

    <out>/<name>/points.jsonl    one line per finished point: id, status, run folder, error
    <out>/<name>/runs/<run_id>/  the run folders (see results/README.md)
    <out>/<name>/runs.parquet    one row per run: flattened config + scalar summary metrics
    <out>/<name>/figures/        PNG + SVG from testbed.analysis.plots

Spec parsing and grid expansion live in `testbed.sweep.spec`; --update-baseline and --check in
`testbed.sweep.check`; the table's I/O in
`testbed.analysis.results` and `testbed.analysis.plots` (`load_table` and `run_tables` are
importable from here too).

--update-baseline runs every point afresh (earlier run folders are kept, not reused), with
`--repeats` repeats (default: the spec's, at least 5; a baseline needs 3 to measure each
point's spread; it stops at the first run that does not complete) and, if all completed and the curves follow the cost model, writes the step-time
ratios, their spread and the provenance to --baseline (default results/baselines/scaling.json;
`testbed.analysis.baseline`, format in results/README.md). Only this flag writes a baseline.

--check runs every point afresh with the spec's repeats and compares each curve with the
baseline and the cost model (`testbed.analysis.regression`); when a point is out of its band,
every point runs once more and the check compares the median of both (a real slowdown drifts
twice; docs/sweeps.md). It prints the table, writes
regression.json, regression.md and regression.png into the sweep folder, and exits 0 when every
point is within its band, 1 on drift (or a run that failed), 2 on bad input: no baseline, a spec
that changed since the baseline was measured, or a real-network baseline measured on another
machine class (unless --allow-machine-change); all of that is refused before Ray starts.
"""

from __future__ import annotations

import sys

from testbed.session.interrupts import INTERRUPTS

__all__ = ["main"]
# What users and tests import from here, served from testbed.sweep.runner on first use (PEP 562), so
# that `python -m testbed.sweep` reaches its signal handler before pandas and matplotlib load.
EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    """The command. Its imports (pandas, matplotlib: a second or two) load under the signal
    policy of testbed.session.interrupts, as `testbed.run`'s do: a signal while they load, or before
    the first point runs, ends the sweep with one line and exit 130; during the points the
    sweep saves what finished (testbed.sweep.runner)."""
    started = False
    with INTERRUPTS:
        try:
            with INTERRUPTS.deferred():  # a signal here is held until the block ends, then raised
                from testbed.sweep.runner import main as run_sweep
            started = True
            return run_sweep(argv)
        except KeyboardInterrupt:
            where = ("; every point that finished is in points.jsonl: run the command again to go on"
                     if started else " before the sweep started")
            print(f"testbed.sweep: error: interrupted by {INTERRUPTS.name}{where}", file=sys.stderr)
            return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
