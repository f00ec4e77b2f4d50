"""Every column and summary key a run writes, with its unit and meaning: the one source of the
tables in results/README.md (`python -m testbed.docs` writes them there; a test checks that
they are current and that every key a run produces is documented here or by its strategy's
spec, `StrategySpec.summary_keys`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# column -> (unit, meaning)
STEP_COLUMNS = {
    "run_id": ("", "the run folder name"),
    "strategy": ("", "strategy name"),
    "worker": ("", "worker rank, 0..N-1"),
    "iteration": ("", "this worker's iteration index, from 0"),
    "version_read": ("", "version of the parameters the gradient was computed from"),
    "version_applied": ("", "version the gradient was applied at; null if dropped, skipped or never applied"),
    "t_start": ("s (epoch)", "when the iteration started"),
    "compute_s": ("s", "forward + backward (or synthetic compute) time, injected delay excluded"),
    "comm_s": ("s", "time moving parameters / gradients on the critical path (after backward, for "
                    "overlapped allreduce)"),
    "wait_s": ("s", "time blocked on others (barriers, the server, the driver's reduce, SSP)"),
    "bytes_sent": ("bytes", "logical bytes this worker sent in the iteration"),
    "bytes_recv": ("bytes", "logical bytes it received"),
    "samples": ("samples", "training samples in the gradient"),
    "loss": ("", "training loss on the worker's batch"),
    "staleness": ("versions", "`version_applied - version_read`; 0 for synchronous strategies; null "
                              "where the gradient was not applied (so a column mean is over applied ones)"),
    "injected_delay_s": ("s", "straggler delay injected into this iteration (`--straggler`)"),
    "late_s": ("s", "emulated network: how much later than their emulated delivery this worker's "
                    "messages arrived (real cost the emulator could not hide); 0 otherwise"),
    "peers_lag_s": ("s", "emulated peers (`--real-workers`): how much later than this worker the slowest "
                         "peer it plays had its gradient, its straggler delays beyond this worker's (over a "
                         "local SGD round, added up); 0 otherwise"),
    "node": ("", "the Ray node the worker ran on: its IP address (with `/` and 6 hex digits of the "
                 "node id where several nodes share an address); a worker restarted elsewhere shows "
                 "its new node from then on"),
    "emulated": ("", "true for an emulated peer's iteration (ps-async with `--real-workers` below `--workers`: "
                     "each peer runs its own iterations at the model's times, docs/emulation.md); its "
                     "compute is the configured one, not measured; false for a real worker's"),
}
UPDATE_COLUMNS = {
    "version": ("", "parameter version after the update (1 for the first)"),
    "t_applied": ("s (epoch)", "when it was applied"),
    "contributors": ("gradients", "gradients averaged into it"),
    "dropped": ("gradients", "gradients left out of it (late backup workers, non-finite ones)"),
    "loss": ("", "mean training loss of the contributing gradients (gossip: of the average model)"),
}
EVENT_COLUMNS = {
    "actor": ("", "`worker<r>`, `ps<s>`, `driver` or `ring`"),
    "phase": ("", "`compute`, `send`, `recv`, `reduce`, `apply`, `wait` or `fault`"),
    "t0": ("s (epoch)", "start of the span"),
    "t1": ("s (epoch)", "end of the span"),
}
EVAL_COLUMNS = {
    "version": ("", "the parameter version evaluated (0: the initial parameters)"),
    "train_s": ("s", "when that version was applied, from the first worker iteration's start (0 for version 0)"),
    "samples_seen": ("samples", "training samples in the gradients applied up to that version "
                                "(batch size x contributors)"),
    "eval_loss": ("", "mean held-out cross-entropy (nats per sample; per token for the transformer); "
                      "synthetic: the noise-free objective 1/2 mean (w - w*)^2"),
    "eval_acc": ("fraction", "held-out top-1 accuracy (per token for the transformer); null for synthetic"),
    "eval_ms": ("ms", "how long the evaluation took, in its own process at the lowest CPU priority "
                      "(real milliseconds, never a step's time)"),
    "t_applied": ("s (epoch)", "when the version was applied (the first iteration's start for version 0)"),
    "t_done": ("s (epoch)", "when its evaluation finished (it may lag behind training)"),
}

# summary.json keys of every run -> (unit, meaning)
SUMMARY = {
    "schema_version": ("", "format version of the run folder"),
    "run_id": ("", "the run folder name"),
    "status": ("", "`completed`, `failed`, `diverged` (non-finite gradients past --max-skipped, "
                   "--on-nan stop, non-finite final parameters or loss) or `interrupted` (SIGINT, "
                   "SIGTERM, SIGHUP); a folder without summary.json reads back as `crashed`"),
    "error": ("", "how a run that did not complete ended, in one line (null when it completed)"),
    "strategy": ("", "strategy name"),
    "workers": ("", "N"),
    "worker_nodes": ("count", "distinct Ray nodes the workers ran on (`node` in steps.parquet)"),
    "real_workers": ("count", "workers started as processes (`--real-workers`); the others were emulated "
                              "peers, played by them, with no records of their own (docs/emulation.md, "
                              "\"Emulated peers\")"),
    "actor_nodes": ("count", "distinct Ray nodes the run's actors (workers and servers) were placed on "
                             "at its start; more than 1 makes a calibrated prediction use the "
                             "inter-node link"),
    "cluster_nodes": ("count", "live Ray nodes in the cluster when the run started"),
    "worker_processes": ("count", "actor processes the workers lived in: N, or ceil(N / K) with "
                                  "--workers-per-process K"),
    "device": ("", "where the workers computed: cpu or cuda (--device resolved against the cluster)"),
    "gpus_per_worker": ("GPUs", "each worker process's share of a GPU (0 on the CPU; below 1 where "
                                "several workers share one)"),
    "workload": ("", "workload name"),
    "steps": ("updates", "model updates actually applied"),
    "worker_iterations": ("", "rows of steps.parquet"),
    "elapsed_s": ("s", "whole run, including Ray and actor start-up and teardown"),
    "startup_s": ("s", "from the start of the run to the first worker iteration"),
    "startup_ray_s": ("s", "of that: checks and starting (or attaching to) Ray"),
    "tensors": ("count", "gradient tensors of a synthetic workload (8, or the profile's model's); null "
                         "for a torch model"),
    "startup_actors_s": ("s", "of that: the run folder, the strategy's actor processes and their wiring"),
    "startup_first_update_s": ("s", "from the actors being ready to the first model update (real "
                                    "seconds, not divided by --dilation)"),
    "first_update_after_launch_s": ("s", "from the `testbed.run` process starting (interpreter, imports) "
                                         "to the first model update; null in sweeps"),
    "dilation": ("", "`--dilation` D: the emulated cluster ran D times slower and every time in the "
                     "records and the summary (start-up and elapsed aside) is divided by D"),
    "train_wall_s": ("s", "first worker iteration's start to the last model update"),
    "samples_per_s": ("samples/s", "samples of applied gradients / `train_wall_s` (compare strategies with this)"),
    "updates_per_s": ("updates/s", "model updates / `train_wall_s`"),
    "step_time_mean_s": ("s", "mean interval between consecutive model updates (the first from the first start)"),
    "step_time_p50_s": ("s", "median of those intervals"),
    "step_time_p95_s": ("s", "95th percentile of those intervals"),
    "compute_frac": ("fraction", "share of summed worker time in compute, injected delay included"),
    "comm_frac": ("fraction", "share of summed worker time in communication"),
    "wait_frac": ("fraction", "share of summed worker time waiting; the three add up to 1"),
    "injected_delay_frac": ("fraction", "share of summed worker time that was injected straggler delay"),
    "bytes_sent_per_worker_per_step": ("bytes", "mean logical bytes a worker sent per iteration"),
    "bytes_recv_per_worker_per_step": ("bytes", "mean logical bytes a worker received per iteration"),
    "loss_first": ("", "loss of the first model update"),
    "loss_last": ("", "loss of the last model update"),
    "staleness_mean": ("versions", "mean staleness over applied gradients"),
    "staleness_p95": ("versions", "95th percentile of the same"),
    "staleness_max": ("versions", "largest staleness of an applied gradient"),
    "dropped_gradients": ("gradients", "sum of `dropped` over updates"),
    "updates_per_worker": ("", "`{rank: gradients of this worker that were applied}`"),
    "straggler_attribution": ("s", "`{rank: {ready_lag_s, wait_s}}`: how late the worker's gradient was "
                                   "ready at each sync point (vs the earliest), and how long it waited there"),
    "comm_s_per_step": ("s", "synchronous strategies: median step interval minus the median slowest "
                             "compute (+ injected delay) per step, not clamped (the means for local-sgd, "
                             "which communicates on one step in H); asynchronous: mean `comm_s`"),
    "predicted_bytes_sent_per_worker_per_step": ("bytes", "the cost model's bytes a worker sends per "
                                                          "iteration, beside the measured mean"),
    "predicted_comm_s": ("s", "emulated or calibrated network: the alpha-beta model's communication "
                              "per update"),
    "predicted_comm_s_no_overlap": ("s", "emulated or calibrated network: the model's no-overlap upper bound"),
    "predicted_overlap_saved_s": ("s", "emulated or calibrated network: `predicted_comm_s_no_overlap - "
                                       "predicted_comm_s`, what the model says overlap (or pipelining) hides "
                                       "(the ring's measured counterpart: `overlap_saved_s`)"),
    "predicted_compute_s": ("s", "emulated or calibrated network: the compute the step prediction adds"),
    "predicted_compute_source": ("", "where that compute comes from: `--compute-ms` (synthetic) or "
                                     "`measured` (a real model's median slowest compute)"),
    "predicted_step_s": ("s", "emulated or calibrated network: `predicted_compute_s + predicted_comm_s`"),
    "formula": ("", "emulated or calibrated network: the cost-model formula used"),
    "prediction_source": ("", "where the model's latency and bandwidth come from: `emulated network`, or "
                              "`calibration FILE (PATH: alpha, bandwidth, scope)` on a real network"),
    "calibrated_fit": ("ratio", "real network with --calibration: `comm_s_per_step / predicted_comm_s` "
                                "(1: the measured alpha and beta explain the run)"),
    "prediction_missing": ("", "why a prediction is absent (a real network, a library collective, ...)"),
    "endpoint_late_s": ("s", "emulated network: the same lateness at the servers or the driver, summed"),
    "emulation_late_s_per_update": ("s", "emulated network: all endpoints' lateness per model update, "
                                         "per iteration for an asynchronous strategy (an upper bound on "
                                         "the real cost added to a step)"),
    "emulation_leak_frac": ("fraction", "emulated network: `emulation_late_s_per_update / "
                                        "predicted_comm_s`, the share of the predicted communication that "
                                        "real per-message cost leaked into; near 0 means the emulator hid it"),
    "emulation_fidelity": ("ratio", "emulated network: `comm_s_per_step / predicted_comm_s`; 1 is a "
                                    "perfect emulation"),
    "emulation_compute_ratio": ("ratio", "emulated network, synthetic compute: the mean iteration's `compute_s` "
                                         "over `--compute-ms`; above 1, this machine's processes woke late (more "
                                         "at once than its cores), which steps and throughput carry and "
                                         "`emulation_fidelity` does not; `emulation_faithful` needs it at most 1.05"),
    "compute_warning": ("", "emulated network, synthetic compute: one line when `emulation_compute_ratio` is "
                            "more than 5% above 1 (at least 3 updates), with the fix; null otherwise"),
    "machine_cpu_busy": ("fraction", "the share of all the machine's CPUs busy while the strategy trained "
                                     "(Linux /proc/stat; null elsewhere), this run's processes included"),
    "foreign_cpu_share": ("fraction", "the share of all the machine's CPUs that processes other than this "
                                      "run's (the driver, the Ray it started and their descendants) used while "
                                      "it trained: contention a measurement cannot tell from its own cost; "
                                      "null where Ray was not started by this process (attached to a cluster). "
                                      "Linux counts both in ticks (10 ms) per process and per CPU, so a window "
                                      "of under a second is good to a few ticks a process: a short run's may "
                                      "come out a little below 0"),
    "emulation_faithful": ("", "emulated network: true when `emulation_fidelity` is within 5% of 1, "
                               "`emulation_leak_frac` at most 0.5 and `emulation_compute_ratio`, where there "
                               "is one, at most 1.05, false when not (at least 3 updates; "
                               "null otherwise): a run that is not faithful keeps its numbers and says so here"),
    "dilation_search": ("", "--dilation auto: one row per trial run (`dilation`, `status`, "
                            "`emulation_fidelity`, `emulation_leak_frac`, `faithful`, `step_time_mean_s` "
                            "as the trial reported it, `wall_s` real seconds, `run_id` under dilation-search/, or "
                            "this run's own where the last trial was the whole run, `foreign_cpu_share`, "
                            "`emulation_compute_ratio`)"),
    "dilation_search_result": ("", "--dilation auto: one line, why the search stopped at `dilation` "
                                   "(faithful, the budget, or more dilation cannot help), and where other processes "
                                   "used a quarter of the CPUs or more in a trial, how much"),
    "dilation_search_s": ("s", "--dilation auto: real seconds the trials took, a trial that was the "
                              "whole run included (never divided by the dilation)"),
    "fidelity_warning": ("", "emulated network: one line when `emulation_fidelity` is off by more than "
                             "5% (at least 3 updates), with the fix (a --dilation that would fit; below the model, one "
                             "only when the emulator ran late: `emulation_leak_frac` above 0.5); "
                             "`testbed.run` prints it; null otherwise"),
    "faults": ("", "list of faults and recoveries: `kind` (worker-restart, server-restart, nan-skipped, "
                   "worker-lost: a gossip worker's death, which nothing recovers; fault-not-reached: a "
                   "`--fail` item the completed run never got to, with its `fault` and the `error` line "
                   "`testbed.run` prints), `actor`, `iteration`, `t0`, `time_lost_s`, and kind-specific detail"),
    "rolled_back_updates": ("", "updates undone by a parameter-server rollback (kept aside, not in "
                                "updates.parquet)"),
    "eval_every": ("updates", "`--eval-every`: versions 0, K, 2K, ... and the last are evaluated (0: none)"),
    "evaluations": ("count", "rows of evals.parquet"),
    "eval_loss_last": ("", "held-out loss of the last version evaluated (evals.parquet); null without evaluations"),
    "eval_acc_last": ("fraction", "its held-out accuracy; null where the workload has none"),
    "eval_loss_best": ("", "lowest held-out loss of any version evaluated"),
    "eval_loss_optimum": ("", "the best held-out loss the data allow, where it is known exactly: the "
                              "transformer's generated language (its entropy, testbed/workloads/language.py), "
                              "0 for synthetic; null otherwise"),
    "target_loss": ("", "`--target-loss`, or null"),
    "target_acc": ("fraction", "`--target-acc`, or null"),
    "time_to_target_s": ("s", "`train_s` of the first version evaluated whose loss is <= --target-loss "
                              "(and accuracy >= --target-acc); null when not reached (an upper bound by "
                              "at most one evaluation interval)"),
    "updates_to_target": ("updates", "that version; null when not reached"),
    "samples_to_target": ("samples", "its `samples_seen`; null when not reached"),
    "eval_error": ("", "why evaluations are missing or stopped (one line), null when they all ran"),
}


def table(rows: Mapping[str, tuple[str, str]], head: tuple[str, str, str] = ("key", "unit", "meaning")) -> str:
    """A markdown table of {name: (unit, meaning)}."""
    lines = [f"| {head[0]} | {head[1]} | {head[2]} |", "|---|---|---|"]
    lines += [f"| `{name}` | {unit} | {meaning} |" for name, (unit, meaning) in rows.items()]
    return "\n".join(lines)


def strategy_table(specs: Mapping[str, Any]) -> str:
    """The strategies' own summary keys, one row per key, naming the strategies that write it."""
    rows: dict[str, tuple[str, list[str]]] = {}
    for name, spec in specs.items():
        for key, meaning in spec.summary_keys.items():
            unit, _, text = meaning.partition(": ") if ": " in meaning else ("", "", meaning)
            rows.setdefault(key, (f"{unit}|{text}", []))[1].append(name)
    lines = ["| key | strategies | unit | meaning |", "|---|---|---|---|"]
    for key, (text, names) in rows.items():
        unit, meaning = text.split("|", 1)
        lines.append(f"| `{key}` | {', '.join(names)} | {unit} | {meaning} |")
    return "\n".join(lines)


def sections(specs: Mapping[str, Any]) -> dict[str, str]:
    """The generated parts of results/README.md, by marker name."""
    return {"steps": table(STEP_COLUMNS, ("column", "unit", "meaning")),
            "updates": table(UPDATE_COLUMNS, ("column", "unit", "meaning")),
            "events": table(EVENT_COLUMNS, ("column", "unit", "meaning")),
            "evals": table(EVAL_COLUMNS, ("column", "unit", "meaning")),
            "summary": table(SUMMARY),
            "strategy-summary": strategy_table(specs)}


def documented(specs: Mapping[str, Any]) -> set[str]:
    """Every summary key some documentation explains."""
    return set(SUMMARY) | {k for spec in specs.values() for k in spec.summary_keys}


def fill(text: str, parts: Mapping[str, str]) -> str:
    """Replace each `<!-- keys:NAME -->...<!-- /keys -->` block of TEXT with parts[NAME]."""
    out, rest = [], text
    while "<!-- keys:" in rest:
        head, _, tail = rest.partition("<!-- keys:")
        name, _, tail = tail.partition(" -->")
        _, _, rest = tail.partition("<!-- /keys -->")
        out += [head, f"<!-- keys:{name} -->\n", parts[name], "\n<!-- /keys -->"]
    return "".join(out) + rest
