"""The cost model beside the measurement: what a run's summary predicts, and why where it cannot.

`predictions` asks the run's strategy spec (a `testbed.strategies.contract.StrategySpec`: its
`predict`, `bytes_per_worker`, `synchronous`, `period` and `message_path`) on the link the run had -- the
emulated network's settings, or a real network's calibration for the path its messages take --
and sets the measured communication beside it: for a synchronous strategy the critical path's
(`critical_comm_s`; its means where the strategy communicates on some iterations only), for an
asynchronous one the workers' mean. On an emulated network it also
says how much the emulation leaked (`emulation_leak_frac`) and what `--dilation` would hide it.
Pure (numpy, pandas).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from testbed.analysis.costmodel import NotModelled
from testbed.config import RunConfig
from testbed.config.calibration import load_calibration
from testbed.emulation.dilation import FIDELITY_TOLERANCE, advice, faithful


def critical_comm_s(steps: Any, updates: Any, periodic: bool = False) -> float:
    """Median step interval minus the median of each step's slowest compute (sync strategies).

    What is not the slowest worker's compute is communication (and coordination) on the
    critical path. Medians keep the first, warm-up step from dominating short runs. It can
    come out negative (compute that overlapped communication); it is not clamped. A strategy
    that communicates on some iterations only (`periodic`: local SGD averages every H-th) is
    measured by the means instead: the median interval is one without communication.
    """
    t = np.sort(updates["t_applied"].to_numpy(dtype=float))
    intervals = np.diff(np.concatenate([[float(steps["t_start"].min())], t]))
    if periodic:
        return float(np.mean(intervals)) - float(slowest_compute(steps).mean())
    return float(np.median(intervals)) - float(slowest_compute(steps).median())


def network_link(spec: Any, cfg: RunConfig, nodes: int) -> tuple[tuple[float, float], str] | str:
    """((latency s, bandwidth B/s), where they come from) for the cost model, or why there are none:
    the emulated network's settings, or a real network's calibration for this strategy's path --
    its inter-node link when the run's actors sit on more than one node (`nodes`): every
    strategy's step then waits on messages that cross nodes, the slower link."""
    net = cfg.network
    if net.emulated:
        return (net.latency_s, net.bandwidth_Bps), "emulated network"
    if net.calibration is None:
        return ("real network: its latency and bandwidth are unknown; emulate one (--bandwidth, "
                "--latency) or measure this one (python -m testbed.bench network --out FILE, then "
                "--calibration FILE) for the cost model's time")
    cal = load_calibration(net.calibration)
    path, across = spec.message_path(cfg), nodes > 1
    if path not in cal.links and not (across and path in cal.inter_links):
        held = sorted(cal.links) + [f"{p} across nodes" for p in sorted(cal.inter_links)]
        return (f"calibration {net.calibration} has no fit of the '{path}' path "
                f"{'across nodes or on one node' if across else 'on one node'} (this run's messages take it; "
                f"it holds {', '.join(held) or 'none'}); measure it again with python -m testbed.bench network")
    link, said = cal.link(path, across=across)
    return (link.alpha_s, link.bandwidth_Bps), said


def slowest_compute(steps: Any) -> Any:
    """Per iteration, the slowest worker's compute plus injected delay, an emulated peer's
    included: a real worker's row carries its slowest peer's lag beyond it (`peers_lag_s`;
    absent from runs recorded before it was)."""
    ready = steps["compute_s"] + steps["injected_delay_s"]
    if "peers_lag_s" in steps:
        ready = ready + steps["peers_lag_s"]
    return ready.groupby(steps["iteration"]).max()


def real_rows(steps: Any) -> Any:
    """Which step rows are real workers' (not an emulated peer's, `emulated`: ps-async's)."""
    if "emulated" not in steps:  # every row, in runs recorded before the column
        return np.ones(len(steps), dtype=bool)
    return ~steps["emulated"].fillna(False).astype(bool)


def compute_fidelity(measured: float, configured: float, updates: int) -> dict[str, Any]:
    """The emulated compute beside --compute-ms: `emulation_compute_ratio` (the mean iteration's
    compute over it) and, from 3 updates, a warning where it is more than FIDELITY_TOLERANCE
    above. A synthetic iteration sleeps to its compute's end, so above 1 its processes woke late:
    more of them at once than this machine's cores (ps-async's first iterations all start
    together). Steps and throughput carry that and `emulation_fidelity`, communication only, does
    not; `emulation_faithful` reads it (testbed.emulation.dilation.faithful)."""
    ratio = measured / configured
    warn = None
    if updates >= 3 and ratio > 1 + FIDELITY_TOLERANCE:
        warn = (f"measured compute {measured:.4g} s per iteration is {ratio:.2f}x --compute-ms's {configured:.4g} s: "
                "this machine's processes woke late (more at once than its cores), which the step times and "
                "throughput carry; rerun with a larger --dilation")
    return {"emulation_compute_ratio": ratio, "compute_warning": warn}


def predictions(spec: Any, cfg: RunConfig, summary: dict[str, Any], steps: Any, updates: Any,
                extra: dict[str, Any]) -> dict[str, Any]:
    """The cost model beside the measurement: bytes always; time whenever the network's alpha and
    beta are known (emulated). Where there is no prediction, `prediction_missing` says why.

    A prediction is a field of the summary, never a reason to lose it: whatever the model raises
    (a calibration file changed since the run was validated, a number the formulas refuse)
    becomes `prediction_missing`, beside what was predicted before it."""
    out: dict[str, Any] = {}
    try:
        _predict(out, spec, cfg, summary, steps, updates, extra)
    except Exception as exc:  # noqa: BLE001 -- recorded in the summary, never raised past it
        out["prediction_missing"] = f"the cost model failed: {type(exc).__name__}: {exc}"
    return out


def _predict(out: dict[str, Any], spec: Any, cfg: RunConfig, summary: dict[str, Any], steps: Any,
             updates: Any, extra: dict[str, Any]) -> dict[str, Any]:
    """predictions' work, filling OUT as it goes (so a failure keeps what came before it)."""
    if not len(steps) or summary.get("step_time_mean_s") is None:
        out["prediction_missing"] = "no model update was recorded"
        return out
    sync = spec.synchronous(cfg)
    out["comm_s_per_step"] = (critical_comm_s(steps, updates, spec.period(cfg) > 1) if sync
                              else float(steps["comm_s"].mean()))
    if "grad_bytes_logical" not in extra:
        out["prediction_missing"] = "the strategy did not report its gradient size"
        return out
    out["predicted_bytes_sent_per_worker_per_step"] = spec.bytes_per_worker(cfg, extra)
    link = network_link(spec, cfg, extra.get("actor_nodes") or 1)
    if isinstance(link, str):
        out["prediction_missing"] = link
        return out
    (latency, bandwidth), out["prediction_source"] = link
    try:
        pred = spec.predict(cfg, extra, latency, bandwidth)
    except NotModelled as exc:
        out["prediction_missing"] = str(exc)
        return out
    if not cfg.workload.real_compute:
        compute, source = cfg.workload.compute_ms / 1000.0, "--compute-ms"
    else:  # a real model's compute is what it measured: the model explains communication
        compute, source = float(slowest_compute(steps).median()), "measured"
    if cfg.network.emulated:
        # what the emulator could not hide: messages that arrived after their emulated delivery,
        # in comm_s_per_step's unit (an update; an iteration for an asynchronous strategy)
        per = len(updates) if sync else len(steps)
        late = (float(steps["late_s"].sum()) + float(extra.get("endpoint_late_s", 0.0))) / max(1, per)
        out.update({"emulation_late_s_per_update": late,
                    "emulation_leak_frac": late / pred.comm_s if pred.comm_s > 0 else None})
        out["emulation_fidelity"] = out["comm_s_per_step"] / pred.comm_s if pred.comm_s > 0 else None
        if not cfg.workload.real_compute and compute > 0:
            measured = steps[real_rows(steps)]  # an emulated peer's compute is set, not measured
            out.update(compute_fidelity(float(measured["compute_s"].mean()), compute, len(updates)))
        out["emulation_faithful"] = (faithful(out["emulation_fidelity"], out["emulation_leak_frac"],
                                              out.get("emulation_compute_ratio")) if len(updates) >= 3 else None)
        out["fidelity_warning"] = (advice(out["comm_s_per_step"], pred.comm_s, cfg.network.factor,
                                          not cfg.workload.real_compute, out["emulation_leak_frac"]) if len(updates) >= 3 else None)
    else:
        out["calibrated_fit"] = out["comm_s_per_step"] / pred.comm_s if pred.comm_s > 0 else None
    out.update({"predicted_comm_s": pred.comm_s, "predicted_step_s": compute + pred.comm_s,
                "predicted_compute_s": compute, "predicted_compute_source": source,
                "formula": pred.formula,
                "predicted_comm_s_no_overlap": pred.comm_s if pred.comm_s_no_overlap is None
                else pred.comm_s_no_overlap})
    out["predicted_overlap_saved_s"] = out["predicted_comm_s_no_overlap"] - pred.comm_s
    return out
