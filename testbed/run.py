"""One run: argv -> RunConfig -> Cluster -> Strategy -> results folder.

    python -m testbed.run --strategy ring --workers 8

Prints a progress bar, a summary table and, as the last stdout line, the run folder. Bad input
is one stderr line naming the value and the fix, exit 2, before Ray starts. However a run ends
(testbed/session/execute.py lists the statuses and exit codes: failed 1 or 3, diverged 4, a signal 130)
it keeps what was measured and says why in one stderr line.

This module imports nothing heavy at its top (numpy, pandas, Ray, torch come with the config and
the session inside `main`): a signal that arrives while they load, a second or more on a busy
machine, then finds the command's handler installed and ends the command as interrupted (exit
130) instead of as a traceback. Only the interpreter's own start, before this module runs, is
left to Python's default handling.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any

from testbed.session.interrupts import INTERRUPTS
from testbed.util.machine import busy

if TYPE_CHECKING:
    from testbed.config import RunConfig

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

__all__ = ["format_summary", "main", "parse_args"]


def parse_args(argv: list[str] | None = None) -> RunConfig:
    """argv -> validated RunConfig for the registered strategies (ConfigError: one line)."""
    from testbed.config import parse_config
    from testbed.strategies import registry

    return parse_config(argv, registry.SPECS)


def main(argv: list[str] | None = None) -> int:
    with INTERRUPTS:
        try:
            with INTERRUPTS.deferred():  # a signal while the command starts is held, then raised
                from testbed.config import ConfigError

                cfg = parse_args(argv)
                from testbed.session.execute import execute
        except ConfigError as exc:
            print(f"testbed.run: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt:
            print(f"testbed.run: error: interrupted by {INTERRUPTS.name} before the run started",
                  file=sys.stderr)
            return EXIT_INTERRUPTED
        if cfg.network.calibration is not None:
            from testbed.analysis.provenance import calibration_machine_change

            change = calibration_machine_change(cfg.network.calibration)
            if change:
                print(f"testbed.run: warning: {change}", file=sys.stderr)
        outcome = execute(cfg, launched=process_started())
        with INTERRUPTS.shielded():
            return _report(cfg, outcome)


def _report(cfg: RunConfig, outcome: Any) -> int:
    if outcome.error_line:
        print(f"testbed.run: error: {outcome.error_line}", file=sys.stderr)
    for fault in (outcome.summary or {}).get("faults") or []:
        if fault.get("kind") == "fault-not-reached":
            print(f"testbed.run: warning: {fault['error']}", file=sys.stderr)
    search = (outcome.summary or {}).get("dilation_search_result")
    if search and not search.startswith("faithful"):
        print(f"testbed.run: warning: --dilation auto: {search}", file=sys.stderr)
    for warning in ("fidelity_warning", "compute_warning"):
        if outcome.summary and outcome.summary.get(warning):
            print(f"testbed.run: warning: {outcome.summary[warning]}", file=sys.stderr)
    if outcome.exit_code == 0 and outcome.summary and outcome.summary.get("eval_error"):  # else: the error above
        print(f"testbed.run: warning: held-out evaluation: {outcome.summary['eval_error']}", file=sys.stderr)
    if outcome.folder is not None:
        if not cfg.quiet and outcome.summary:
            print(format_summary(outcome.summary))
        print(outcome.folder)
    if not outcome.clean:  # Ray did not stop in time (a signal took its processes): leave now,
        sys.stdout.flush()  # without the interpreter's exit hooks waiting on it again
        sys.stderr.flush()
        os._exit(outcome.exit_code)
    return outcome.exit_code


def process_started() -> float | None:
    """Wall-clock time this process started (Linux /proc), for the start-up figures; else None."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as up:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # start, in clock ticks after boot
            age = float(up.read().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError):
        return None


def machine_line(s: dict[str, Any]) -> str:
    """How busy the machine was while the run trained, and how much of it was other processes'."""
    line = f"{s['machine_cpu_busy']:.0%}"
    foreign = s.get("foreign_cpu_share")
    if foreign is None:
        return line + "  (attached to a Ray cluster: other processes' share unknown)"
    line += f"  ({foreign:.0%} by other processes)"
    if busy(foreign):
        line += ": a BUSY machine, whose contention is in every time measured; rerun when quiet"
    return line


def format_summary(s: dict[str, Any]) -> str:
    """The human table printed at the end of a run."""
    def num(key: str, fmt: str = "{:.3g}") -> str:
        v = s.get(key)
        return "-" if v is None else fmt.format(v)

    def ms(key: str) -> str:
        v = s.get(key)
        return "-" if v is None else f"{v * 1e3:.2f} ms"

    split = "-"
    if s.get("compute_frac") is not None:
        split = (f"{s['compute_frac']:.0%} / {s['comm_frac']:.0%} / {s['wait_frac']:.0%}")
    b = s.get("bytes_sent_per_worker_per_step")
    rows = [
        ("strategy", f"{s['strategy']}  (N={s['workers']}, {s.get('status')})"),
        ("updates", f"{s['steps']}  in {num('train_wall_s')} s  (start-up {num('startup_s')} s: Ray "
                    f"{num('startup_ray_s')} s, actors {num('startup_actors_s')} s)"),
        ("throughput", f"{num('samples_per_s', '{:.1f}')} samples/s, {num('updates_per_s', '{:.2f}')} updates/s"),
        ("step time p50 / p95", f"{ms('step_time_p50_s')} / {ms('step_time_p95_s')}"),
        ("compute / comm / wait", split),
        ("bytes sent / worker / step", "-" if b is None else f"{b / 2**20:.3f} MiB"),
        ("loss first -> last", f"{num('loss_first', '{:.4f}')} -> {num('loss_last', '{:.4f}')}"),
    ]
    if s.get("eval_loss_last") is not None:
        acc = "" if s.get("eval_acc_last") is None else f", acc {s['eval_acc_last']:.3f}"
        best = "" if s.get("eval_loss_optimum") is None else f"  (optimum {s['eval_loss_optimum']:.4f})"
        rows.append(("held-out loss (last)", f"{s['eval_loss_last']:.4f}{acc}{best}  [{s['evaluations']} evaluations]"))
    if s.get("target_loss") is not None or s.get("target_acc") is not None:
        hit = ("not reached" if s.get("time_to_target_s") is None else
               f"{s['time_to_target_s']:.2f} s, {s['updates_to_target']} updates, {s['samples_to_target']} samples")
        rows.append(("time to target", hit))
    if s.get("staleness_max") is not None and s.get("staleness_max"):
        rows.append(("staleness mean / p95 / max",
                     f"{s['staleness_mean']:.2f} / {s['staleness_p95']:.1f} / {s['staleness_max']}"))
    if s.get("predicted_step_s") is not None:
        dilated = "" if s.get("dilation", 1.0) == 1.0 else f", dilation {s['dilation']:g}"
        if s.get("dilation_search"):
            dilated = f", dilation {s['dilation']:g} (auto, {len(s['dilation_search'])} trials)"
        ratio = "emulation_fidelity" if s.get("calibrated_fit") is None else "calibrated_fit"
        source = "" if s.get("calibrated_fit") is None else ", calibrated"
        rows.append(("comm measured / predicted",
                     f"{ms('comm_s_per_step')} / {ms('predicted_comm_s')}  "
                     f"({num(ratio, '{:.3f}')}x{dilated}{source})"))
    if s.get("machine_cpu_busy") is not None:
        rows.append(("machine CPUs busy", machine_line(s)))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


if __name__ == "__main__":
    sys.exit(main())
