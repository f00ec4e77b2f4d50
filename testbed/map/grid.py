"""The map's input: a workload profile, the axes of the grid, and what to check. Pure.

Every value is checked here, before Ray starts: a bad one raises ConfigError with the value and
the fix, which the command prints as one line and exits 2.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.config import MAX_WORKERS, WORKLOADS, ConfigError, RunConfig, WorkloadConfig
from testbed.config.calibration import load_calibration
from testbed.util import units
from testbed.workloads import profiles

CALIBRATED = "calibrated"  # the axis value of a real network's measured alpha and bandwidth


@dataclass(frozen=True)
class Grid:
    workload: str
    workers: tuple[int, ...]
    bandwidths: tuple[str, ...]  # as given ("10Gbit"), plus CALIBRATED with --calibration
    latencies: tuple[str, ...]
    compute_ms: float
    node_size: int | None = None
    calibration: str | None = None
    check_cells: int = 0
    target_loss: float | None = None
    accuracy_workload: str = "mlp"  # a real model the samples to target_loss are measured on

    def base(self) -> RunConfig:
        """The config every configuration starts from: the workload shaped as the profile."""
        return RunConfig(workload=WorkloadConfig(name=self.workload, compute_ms=self.compute_ms), quiet=True)

    def links(self) -> list[tuple[str, str]]:
        """The (latency, bandwidth) panels and rows of the grid; the calibrated one last."""
        out = [(lat, bw) for lat in self.latencies for bw in self.bandwidths if bw != CALIBRATED]
        return out + ([(CALIBRATED, CALIBRATED)] if self.calibration else [])


def _items(text: str, flag: str, example: str) -> list[str]:
    items = [t.strip() for t in str(text).split(",")]
    if not text or any(not t for t in items):
        raise ConfigError(f"{flag} {text!r}: give a comma-separated list without empty items, e.g. {example}")
    if len(set(items)) != len(items):
        raise ConfigError(f"{flag} {text!r}: a value appears twice; give each once, e.g. {example}")
    return items


def parse_workers(text: str) -> tuple[int, ...]:
    out = []
    for t in _items(text, "--workers", "8,16,32"):
        try:
            n = int(t)
        except ValueError:
            raise ConfigError(f"--workers {t!r}: not an integer; use worker counts like 8,16,32") from None
        if not 1 <= n <= MAX_WORKERS:
            raise ConfigError(f"--workers {n}: use worker counts in 1..{MAX_WORKERS}, e.g. 8,16,32")
        out.append(n)
    return tuple(sorted(out))


def parse_grid(*, workload: str, workers: str, bandwidth: str, latency: str, compute_ms: float,
               node_size: int | None = None, calibration: str | None = None, check_cells: int = 0,
               target_loss: float | None = None, accuracy_workload: str = "mlp") -> Grid:
    """The validated grid, or ConfigError naming the value and the fix."""
    if workload not in profiles.names():
        raise ConfigError(f"--workload {workload!r}: the map predicts from a model's tensor shapes; use one of "
                          f"{', '.join(profiles.names())}")
    bws = _items(bandwidth, "--bandwidth", "1Gbit,10Gbit")
    for bw in bws:
        try:
            units.parse_bandwidth(bw, flag="--bandwidth")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    lats = _items(latency, "--latency", "50us,1ms")
    for lat in lats:
        try:
            units.parse_duration(lat, flag="--latency")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if not compute_ms >= 0 or compute_ms == float("inf"):
        raise ConfigError(f"--compute-ms {compute_ms!r}: use the milliseconds one worker's step computes, >= 0, "
                          "e.g. 100")
    if node_size is not None and node_size < 1:
        raise ConfigError(f"--node-size {node_size}: use the workers per machine, >= 1, e.g. 8")
    if calibration is not None:
        try:
            load_calibration(calibration)
        except ValueError as exc:
            raise ConfigError(f"--calibration {exc}") from None
    if check_cells < 0:
        raise ConfigError(f"--check-cells {check_cells}: use a number of cells >= 0, e.g. 8")
    if target_loss is not None and not target_loss > 0:
        raise ConfigError(f"--target-loss {target_loss!r}: use a loss > 0, e.g. 0.5")
    if accuracy_workload not in WORKLOADS:
        raise ConfigError(f"--accuracy-workload {accuracy_workload!r}: samples to a loss are measured on a model "
                          f"that trains; use one of {', '.join(WORKLOADS)}")
    return Grid(workload, parse_workers(workers), tuple(bws), tuple(lats), float(compute_ms), node_size,
                calibration, int(check_cells), None if target_loss is None else float(target_loss), accuracy_workload)
