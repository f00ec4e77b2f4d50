"""python -m testbed.map: which strategy configuration wins, cell by cell, for one model profile.

    python -m testbed.map --workload profile:resnet50 --workers 8,16,32,64,128 \\
        --bandwidth 1Gbit,10Gbit,25Gbit,100Gbit [--latency 50us,1ms] [--compute-ms 100] \\
        [--node-size 8] [--calibration FILE] [--check-cells K] [--target-loss L \\
        [--accuracy-workload mlp]] [--out DIR]

Writes into DIR (default results/maps/NAME): map.parquet (one row per cell and configuration:
predicted, rank, efficiency, the cell's winner and margins, measured where checked), map.md (the
answer in sentences, the checks), map.png and map.svg, and checks.jsonl with the check runs'
folders under runs/ (a rerun with the same arguments reuses them); with --target-loss also
accuracy.jsonl and accuracy_runs/, the runs that measure samples to the target (reused too).
Bad input: one line, exit 2, before Ray starts. Exit 1 when a check is off (named in map.md), 130 on a signal.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from testbed.config import ConfigError

PROG = "python -m testbed.map"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse would print usage too)
        raise ConfigError(message)


def parse(argv: list[str] | None):
    from testbed.map.grid import parse_grid

    p = _Parser(prog=PROG, description="Parameter server or allreduce, and when: the winner per "
                "(workers, bandwidth) cell by the cost model, with spot checks run on the emulator.")
    p.add_argument("--workload", required=True, help="profile:NAME (testbed/workloads/profiles.json)")
    p.add_argument("--workers", required=True, help="worker counts, e.g. 8,16,32,64,128")
    p.add_argument("--bandwidth", required=True, help="NIC bandwidths, e.g. 1Gbit,10Gbit,25Gbit,100Gbit")
    p.add_argument("--latency", default="50us", help="one-way latencies, e.g. 50us,1ms (default 50us)")
    p.add_argument("--compute-ms", type=float, default=100.0,
                   help="one worker's forward and backward per step on your device, ms (default 100)")
    p.add_argument("--node-size", type=int, default=None,
                   help="workers per machine: adds the hierarchical allreduce, which groups by it")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="also rank on a measured network (python -m testbed.bench network --out FILE)")
    p.add_argument("--check-cells", type=int, default=0, metavar="K", help="cells to run as emulated experiments")
    p.add_argument("--target-loss", type=float, default=None, metavar="L",
                   help="rank by time to held-out loss L: measure samples to L of each kind of stale or "
                        "averaged-model update against the synchronous step's, in short runs (testbed.map.accuracy)")
    p.add_argument("--accuracy-workload", default="mlp", metavar="NAME",
                   help="the model those runs train (default mlp; a profile has no loss)")
    p.add_argument("--out", default=None, metavar="DIR", help="output folder (default results/maps/NAME)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    grid = parse_grid(workload=args.workload, workers=args.workers, bandwidth=args.bandwidth,
                      latency=args.latency, compute_ms=args.compute_ms, node_size=args.node_size,
                      calibration=args.calibration, check_cells=args.check_cells,
                      target_loss=args.target_loss, accuracy_workload=args.accuracy_workload)
    out = Path(args.out or f"results/maps/{args.workload.split(':', 1)[1]}")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: is a file, not a folder; pick another --out")
    return grid, out, args.quiet


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        grid, out, quiet = parse(argv)
    except ConfigError as exc:
        print(f"testbed.map: error: {exc}", file=sys.stderr)
        return 2
    from testbed.map.build import build

    try:
        return build(grid, out, quiet, " ".join([PROG, *map(shlex.quote, argv)]))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
