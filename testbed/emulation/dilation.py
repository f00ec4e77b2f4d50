"""Time dilation: run the emulated cluster D times slower, report it at its own speed.

Why. On one box every emulated message also costs real work: an actor call or a channel hand-off,
waking a process, summing a chunk, the driver's round trip per step. With N processes on 2 cores
that work queues for the CPU, so at N = 32 it can take longer than the emulated transfer it rides
on, and the measurement drifts from the model (docs/emulation.md, "Fidelity at scale"). Dilation stretches
everything the emulator controls by D and leaves the machine's own costs as they are; dividing
every measured time by D then gives the emulated cluster's times with this machine's overheads
D times smaller:

    emulated, on the wire          real (slept)            reported
    bandwidth B                    B / D                    --
    latency a                      a * D                    --
    synthetic compute c            c * D                    c (+ overhead / D)
    straggler delay d              d * D                    d (+ overhead / D)
    a step of T emulated seconds   D * T + overhead         T + overhead / D

D below 1 runs the emulated cluster faster than real time, and multiplies this machine's
overheads by 1/D instead: worth it where an emulated step lasts far longer than the real work of
its messages (mapreduce at N = 128 with a 1.2 GB gradient: the driver's step is (N+1) K / B, 130 s
at 10 Gbit/s, against a few ms of calls). `--dilation auto` starts there where the model says the
run at D = 1 would take most of its budget (`first_factor`), and the fidelity it measures still
decides: an unfaithful trial raises D as from any factor.

What cannot be dilated is real compute (a torch model's forward and backward), so dilation is
refused for real workloads (`testbed.config.validate`). Ray start-up and the run's elapsed time
are real and are not divided.

Which fields are times: names say it. A key `t_*` or `t0`/`t1` is a wall-clock instant (moved
towards `origin`, the moment training started); a key ending in `_s` (or `_s_p50`, a percentile
of one) is a duration (divided); a key ending in `_Bps` or `_per_s` is a rate (multiplied).
`tests/unit/test_dilation.py` checks that every documented column and strategy summary key
follows that convention.
Pure: no Ray, no torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["FIDELITY_TOLERANCE", "LEAK_LIMIT", "TRIAL_STEPS", "Dilation", "advice", "affordable_factor", "faithful",
           "first_factor", "is_duration", "late_below", "late_factor",
           "is_instant", "is_rate", "next_factor", "run_seconds", "wanted_factor"]


def is_instant(key: str) -> bool:
    return key.startswith("t_") or key in ("t0", "t1")


def is_duration(key: str) -> bool:
    return re.fullmatch(r".+_s(_p\d+)?", key) is not None and not is_rate(key)


def is_rate(key: str) -> bool:
    return key.endswith(("_Bps", "_per_s"))


class Dilation:
    """Map real times of a dilated run to the emulated cluster's times."""

    def __init__(self, factor: float, origin: float) -> None:
        if not factor > 0.0:
            raise ValueError(f"dilation {factor!r}: must be > 0")
        self.factor, self.origin = float(factor), float(origin)

    def instant(self, t: float) -> float:
        return self.origin + (t - self.origin) / self.factor

    def duration(self, s: float) -> float:
        return s / self.factor

    def value(self, key: str, value: Any) -> Any:
        """One field by its name's unit: instants move, durations shrink, the rest stays."""
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, (list, tuple)):
            return [self.value(key, v) for v in value]
        if is_instant(key):
            return self.instant(value)
        if is_duration(key):
            return self.duration(value)
        return value * self.factor if is_rate(key) else value

    def row(self, row: Mapping[str, Any]) -> dict[str, Any]:
        return {k: self.value(k, v) for k, v in row.items()}

    def extras(self, extra: Mapping[str, Any]) -> dict[str, Any]:
        """A summary's extras: durations by name, and rows of lists (faults) field by field."""
        out: dict[str, Any] = {}
        for k, v in extra.items():
            if isinstance(v, list) and v and all(isinstance(x, Mapping) for x in v):
                out[k] = [self.row(x) for x in v]
            else:
                out[k] = self.value(k, v)
        return out


FIDELITY_TOLERANCE = 0.05  # measured communication within 5% of the model counts as faithful
LEAK_LIMIT = 0.5  # emulator lateness per update, over the predicted communication, that it can absorb


def advice(measured: float, predicted: float, dilation: float, can_dilate: bool,
           leak: float | None = None) -> str | None:
    """One line when measured communication per step is off the model by more than
    FIDELITY_TOLERANCE, with the fix; None when it is within. LEAK is the run's
    `emulation_leak_frac`: the emulator's lateness per update over the predicted communication.

    Above the model, the excess is this machine's own cost per step (real seconds: the excess
    times the dilation in use). A dilation D' leaves excess * D / D' of it, so the factor that
    brings it to half the tolerance is D' = D * excess / (tolerance / 2), rounded up.

    Below the model, the run either beat the schedule the model describes (a bug in one of the
    two) or the emulator could not keep up: messages handed over after their emulated delivery
    reserve the NIC queues out of order, and workers starved of CPU compute longer, so the step
    has more compute subtracted from it than its critical path held. LEAK tells them apart. The
    ps-sync run that showed it (N = 64, S = 8, 25 partitions, 10 Gbit/s, 3200 actor calls per
    step) measured 0.92x with a leak of 1.73 at --dilation 4 and 1.000x with 0.10 at
    --dilation 12: lateness falls faster than 1/D (queues drain), so D' = D * leak / LEAK_LIMIT
    brings it under the limit with room to spare (14 there).
    """
    if not (predicted > 0) or measured != measured:
        return None
    ratio = measured / predicted
    if abs(ratio - 1) <= FIDELITY_TOLERANCE:
        return None
    head = (f"measured communication {measured:.4g} s per step is {ratio:.2f}x the cost model's "
            f"{predicted:.4g} s (tolerance {FIDELITY_TOLERANCE:.0%})")
    if ratio < 1:
        if not late_below(ratio, leak):
            return head + ": the run is faster than the model allows; compare the summary's formula with the schedule"
        late = (f": the emulator ran late by {leak:.2f}x the predicted communication per update, so this "
                f"machine could not keep up (late messages reorder the emulated queues)")
        if not can_dilate:
            return head + late + "; use --workload synthetic with --compute-ms, or fewer workers"
        better = _advised(late_factor(dilation, ratio, leak), dilation)
        return head + late + f"; rerun with --dilation {better:g}"
    if not can_dilate:
        return (head + ": this machine's per-message cost shows; real compute cannot be dilated, so use "
                "--workload synthetic with --compute-ms to study this network, or fewer workers")
    better = _advised(dilation * (ratio - 1) / (FIDELITY_TOLERANCE / 2), dilation)
    return (head + f": this machine's own per-message cost adds to the emulated time; rerun with "
            f"--dilation {better:g} (its emulated time then runs {better / dilation:.3g}x slower)")


def late_below(ratio: float, leak: float | None) -> bool:
    """Whether the emulator's lateness can account for a run below the model: late by more than
    LEAK_LIMIT, or by at least as much of the predicted communication as the run is below it.
    Late messages reorder the emulated queues, which moves a step either way by up to about as
    much: ps-sync at N = 128 (16 real, 8 servers, 100 MiB in 25 partitions, 10 Gbit/s, D = 1)
    measured 0.949x with a leak of 0.345, and 1.001x with 0.115 in another run of the same
    config; below the model with less lateness than that, the model or the code is wrong."""
    return leak is not None and (leak > LEAK_LIMIT or leak >= 1 - ratio)


def late_factor(dilation: float, ratio: float, leak: float) -> float:
    """The factor whose lateness no longer accounts for a run below the model by more than the
    tolerance (`late_below`): the leak scaled to LEAK_LIMIT where it was above it, else to the
    shortfall it must stay under (lateness falls at least as fast as 1/D)."""
    return dilation * leak / (LEAK_LIMIT if leak > LEAK_LIMIT else 1 - ratio)


def _advised(wanted: float, dilation: float) -> float:
    """A factor to advise: `wanted` rounded up, and at least twice the one in use (a run below
    1, faster than real time, may be advised a factor below 1 too), at least 2 from 1 on."""
    if dilation < 1 and wanted < 1:
        return _round_up(max(wanted, 2 * dilation))
    return max(2, math.ceil(wanted))


# ---------------------------------------------------------------- --dilation auto: the search
#
# A factor computed from one undilated run overshoots: this machine's cost per message is
# queueing for its cores, and queues drain much faster than 1/D, so the excess at D' is far below
# excess * D / D'. The search therefore measures as it raises D: short trial runs (TRIAL_STEPS
# updates) at D = 1, then at D times the square root of what the trial's own advice asks
# (between MIN_GROWTH and MAX_GROWTH times), until a trial is faithful or the next one and the run
# would not both fit in --fidelity-budget. The run then goes at the last faithful factor, or at
# the largest one measured, and says in its summary whether it was faithful.
#
#     trial  D    fidelity  leak    next
#     1      1    3.00      0.10    1 * clamp(sqrt(1 * 2.00 / 0.025), 2, 8) = 8
#     2      8    1.20      0.02    8 * clamp(sqrt(8 * 0.20 / 0.025 / 8), 2, 8) = 23
#     3      23   1.01      0.01    faithful: the run goes at 23

TRIAL_STEPS = 6  # updates per trial: the fidelity needs 3 (advice); the first steps warm the queues
MIN_GROWTH, MAX_GROWTH = 2.0, 8.0


def faithful(fidelity: float | None, leak: float | None, compute: float | None = None) -> bool | None:
    """Measured communication within FIDELITY_TOLERANCE of the model, with the emulator on time
    (leak at most LEAK_LIMIT) and, where it is known (`compute`: `emulation_compute_ratio`,
    synthetic compute), the compute at most FIDELITY_TOLERANCE above --compute-ms; None when the
    run could not say (no prediction, too few updates)."""
    if fidelity is None or fidelity != fidelity:
        return None
    return (abs(fidelity - 1) <= FIDELITY_TOLERANCE and (leak is None or leak <= LEAK_LIMIT)
            and (compute is None or compute <= 1 + FIDELITY_TOLERANCE))


def wanted_factor(dilation: float, fidelity: float, leak: float | None, compute: float | None = None) -> float:
    """The factor `advice` would name for a run at `dilation` (the one-shot estimate); a late
    compute (`compute` above 1 + FIDELITY_TOLERANCE) asks for its excess at half the tolerance,
    as communication's does, and the larger of the two is wanted."""
    wanted = dilation
    if fidelity > 1 + FIDELITY_TOLERANCE:
        wanted = dilation * (fidelity - 1) / (FIDELITY_TOLERANCE / 2)
    elif leak is not None and leak > LEAK_LIMIT:
        wanted = dilation * leak / LEAK_LIMIT
    elif fidelity < 1 - FIDELITY_TOLERANCE and late_below(fidelity, leak):
        wanted = late_factor(dilation, fidelity, leak)
    if compute is not None and compute > 1 + FIDELITY_TOLERANCE:
        wanted = max(wanted, dilation * (compute - 1) / (FIDELITY_TOLERANCE / 2))
    return wanted


def next_factor(dilation: float, fidelity: float, leak: float | None, ceiling: float = 100_000.0,
                compute: float | None = None) -> float | None:
    """The next trial's factor after an unfaithful trial at `dilation`, or None when raising D
    cannot help (the run is below the model by more than its emulator ran late, `late_below`: a model or code
    question, not this machine's) or the ceiling is reached."""
    wanted = wanted_factor(dilation, fidelity, leak, compute)
    if wanted <= dilation or dilation >= ceiling:
        return None
    growth = min(MAX_GROWTH, max(MIN_GROWTH, math.sqrt(wanted / dilation)))
    raised = dilation * growth
    if raised < 1:  # from a factor below 1 (`first_factor`): two significant digits, not a whole number
        return float(_round_up(raised))
    return float(min(ceiling, math.ceil(raised)))


def _round_up(x: float, digits: int = 2) -> float:
    scale = 10 ** (digits - 1 - math.floor(math.log10(x)))
    return math.ceil(x * scale - 1e-9) / scale


def _round_down(x: float, digits: int = 2) -> float:
    scale = 10 ** (digits - 1 - math.floor(math.log10(x)))
    return math.floor(x * scale + 1e-9) / scale


FIRST_SHARE = 0.5  # the share of --fidelity-budget the first trial and the run may take, by the model


def first_factor(emulated_s: float | None, budget_s: float, floor: float) -> float:
    """The search's first factor: 1, or less where the model says the first trial and the run
    after it would last `emulated_s` of emulated time, more than FIRST_SHARE of the budget at
    D = 1; then the factor that fits them in that share (two significant digits, rounded down),
    at least `floor` (--dilation's lower limit). None or 0 (no prediction): 1.

        mapreduce N = 128, 1.2 GB, 10 Gbit/s: a step of 130 s, 4 updates (the trial is the run):
        520 s at D = 1 against 150 s, so D = 0.28 (146 s of wall time, plus start-up)
    """
    if not emulated_s or emulated_s <= FIRST_SHARE * budget_s:
        return 1.0
    return max(floor, _round_down(FIRST_SHARE * budget_s / emulated_s))


def run_seconds(dilation: float, steps: int, step_s: float, setup_s: float) -> float:
    """Wall time of a run of `steps` updates at `dilation`: its start-up, then each emulated
    step (`step_s`, as a dilated run reports it) taking `dilation` real times as long."""
    return setup_s + steps * step_s * dilation


def affordable_factor(wanted: float, trial_steps: int, run_steps: int, step_s: float, setup_s: float,
                      seconds_left: float) -> float:
    """`wanted`, or the largest whole factor at which one more trial and the run still fit in
    `seconds_left` (each: start-up, then its steps at that factor); `run_steps` 0: the trial is
    the whole run, with no run after it."""
    starts = 2 if run_steps else 1

    def cost(d: float) -> float:
        return run_seconds(d, trial_steps + run_steps, step_s, starts * setup_s)

    if cost(wanted) <= seconds_left:
        return wanted
    if step_s <= 0:
        return 0.0
    return float(math.floor((seconds_left - starts * setup_s) / ((trial_steps + run_steps) * step_s)))
