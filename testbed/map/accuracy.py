"""Time to accuracy for the updates that are not synchronous steps (`--target-loss`).

A stale update (the asynchronous PS, SSP) or an averaged-model one (gossip) costs a different
number of samples to reach a loss than the synchronous minibatch step, so its step time alone
does not compare. With `--target-loss L` the map measures it: one short run per configuration
kind (`Variant.kind`: the variants that differ only in where the bytes go share one) and one of
the synchronous reference (the configuration that wins most cells: every synchronous strategy
takes the same steps), each at ACC_WORKERS workers on a real model (`--accuracy-workload`,
default mlp: the map's own workload is a profile, gradient shapes without a loss), on this
machine's own network, to the same samples budget and evaluated every global batch; a kind
whose update is one worker's gradient on the shared model (`Variant.per_gradient`) at lr / N,
the synchronous step per sample (at the same lr it would take N times the step per sample, and
its factor would measure the learning rate, not the staleness). A kind's

    factor = samples_to_target(kind) / samples_to_target(reference)

multiplies its predicted step time to give its score: time to the target in units of the
reference's step. A kind that does not reach the target within BUDGET times the reference's
samples, or a failed run, has no factor and stays unranked, with the reason; so do all when the
reference does not reach it. Caveat the report repeats: the factor is measured at ACC_WORKERS
and applied at every N, and the asynchronous PS's mean staleness grows with N (about N - 1
versions), so at large N it is an optimistic bound.

Records go to accuracy.jsonl keyed by the run config, so a rerun reuses them (as spotchecks.jsonl).
`kinds`, `factors` and `apply` are pure; `run` starts Ray.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.config import RunConfig, validate, with_overrides
from testbed.map import spotchecks
from testbed.strategies.registry import SPECS

ACC_WORKERS = 4  # workers of every measuring run: small enough for 2 cores, > 1 for staleness
REF_STEPS = 40  # global steps of the reference run (mlp at lr 0.1 reaches loss 0.05 in about 20)
BUDGET = 4  # a kind's samples budget, in reference budgets (a factor up to BUDGET x REF_STEPS / its steps to target)


def kinds(preds: pd.DataFrame) -> pd.DataFrame:
    """One row per kind of the configurations that are not exact: kind, strategy, and the
    overrides of its first configuration (what the measuring run applies). Pure."""
    stale = preds[~preds["exact"].astype(bool) & preds["kind"].notna()]
    return stale.drop_duplicates("kind")[["kind", "strategy", "overrides", "per_gradient"]].reset_index(drop=True)


def reference(cells: pd.DataFrame, preds: pd.DataFrame) -> pd.Series:
    """The synchronous reference: the configuration that wins most cells (ties: by label), else
    the first exact configuration. Pure."""
    winners = cells["winner"].dropna()
    if len(winners):
        counts = winners.value_counts()
        label = sorted(counts[counts == counts.max()].index)[0]
    else:
        label = preds[preds["exact"].astype(bool)]["label"].iloc[0]
    return preds[preds["label"] == label].iloc[0]


def run_config(base: RunConfig, strategy: str, overrides: str, target_loss: float, exact: bool,
               out: Path, per_gradient: bool = False) -> RunConfig:
    """A measuring run: ACC_WORKERS workers of the accuracy workload, the same samples budget
    (BUDGET times it for a stale kind), evaluated every global batch."""
    n = ACC_WORKERS
    own = with_overrides(base, strategy=strategy, workers=n)
    own = with_overrides(own, **json.loads(overrides))
    sync = SPECS[strategy].synchronous(validate(own, SPECS))
    per_batch = 1 if sync else n  # an asynchronous update is one worker's gradient
    steps = REF_STEPS * per_batch * (1 if exact else BUDGET)
    # the same step per sample as the synchronous one, whose update averages N gradients: lr / N
    # where an update is one gradient on the shared model (Zhang et al. 2016's staleness-aware
    # rule; experiments/convergence.toml); a gossip replica steps on its own gradient at lr
    lr = own.workload.learning_rate / (n if per_gradient else 1)
    return validate(with_overrides(own, steps=steps, out=str(out), quiet=True,
                                   **{"eval.target_loss": target_loss, "eval.every": per_batch,
                                      "workload.lr": lr}), SPECS)


def factors(records: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per kind: factor (None when unknown) and the reason, from the measured records
    {"reference": rec, kind: rec}, each with samples_to_target, samples_budget, status. Pure."""
    ref = records.get("reference") or {}
    ref_s = ref.get("samples_to_target")
    out = {}
    for kind, rec in records.items():
        if kind == "reference":
            continue
        s = rec.get("samples_to_target")
        entry = {"kind": kind, "samples_to_target": s, "reference_samples": ref_s, "factor": None, "reason": None}
        if ref.get("status") != "completed" or not ref_s:
            entry["reason"] = "the synchronous reference " + (
                f"ended {ref.get('status')}" if ref.get("status") != "completed"
                else f"did not reach the target within {ref.get('samples_budget')} samples")
        elif rec.get("status") != "completed":
            entry["reason"] = f"its run ended {rec.get('status')}" + (f": {rec['error']}" if rec.get("error") else "")
        elif not s:
            budget = rec.get("samples_budget")
            entry["reason"] = f"not reached within {budget} samples" + (f" (a factor > {budget / ref_s:.2g})" if budget else "")
        else:
            entry["factor"] = s / ref_s
        out[kind] = entry
    return out


def apply(preds: pd.DataFrame, measured: dict[str, dict[str, Any]] | None) -> pd.DataFrame:
    """preds with `accuracy_factor` and `score_s`: an exact configuration scores its predicted
    step; one of a measured kind its step x the kind's factor; any other none (unranked). Pure."""
    out = preds.copy()
    exact = out["exact"].astype(bool)
    factor = pd.Series(float("nan"), index=out.index)
    factor[exact] = 1.0
    if measured:
        known = {k: m["factor"] for k, m in measured.items() if m.get("factor") is not None}
        factor[~exact] = out.loc[~exact, "kind"].map(known).astype(float)
    out["accuracy_factor"] = factor
    out["score_s"] = out["predicted_step_s"].astype(float) * factor
    return out


def run(todo: dict[str, RunConfig], out_dir: Path, quiet: bool) -> dict[str, dict[str, Any]]:
    """Run every measuring run not yet in accuracy.jsonl; return the records by kind."""
    path = out_dir / "accuracy.jsonl"
    done = spotchecks.read_records(path)
    keys = {name: spotchecks.config_key(cfg) for name, cfg in todo.items()}
    pending = [name for name in todo if keys[name] not in done]
    if pending:
        _run_pending(pending, todo, keys, done, path, quiet)
    return {name: done[keys[name]] for name in todo if keys[name] in done}


def _run_pending(pending: list[str], todo: dict[str, RunConfig], keys: dict[str, str],
                 done: dict[str, dict[str, Any]], path: Path, quiet: bool) -> None:
    spotchecks.run_logged([(keys[name], name, lambda name=name: _measure(name, todo[name], keys[name]))
                       for name in pending], done, path, total=len(todo), desc="accuracy", quiet=quiet)


def _measure(name: str, cfg: RunConfig, key: str) -> dict[str, Any]:
    """One measuring run of a kind: its samples to the target, within the samples it had."""
    status, summary, error, folder = spotchecks.run_one(cfg)
    summary = summary or {}
    n_batch = cfg.workload.batch_size * (cfg.workers if SPECS[cfg.strategy].synchronous(cfg) else 1)
    return {"key": key, "kind": name, "strategy": cfg.strategy, "workers": cfg.workers,
            "workload": cfg.workload.name, "status": status, "error": error, "run_dir": folder,
            "samples_to_target": summary.get("samples_to_target"),
            "samples_budget": cfg.steps * n_batch, "eval_loss_last": summary.get("eval_loss_last")}


def section(target_loss: float | None, workload: str | None, measured: dict[str, dict[str, Any]] | None,
            reference_label: str | None) -> list[str]:
    """map.md's lines on what the ranking used for the updates that are not synchronous. Pure."""
    if target_loss is None:
        return ["Without `--target-loss` the ranking is by predicted step time, and the stale or averaged-model "
                "updates are not ranked: how many more samples they need is not measured.", ""]
    lines = [f"Time to held-out loss {target_loss:g}: each stale or averaged-model configuration's predicted step "
             f"time is multiplied by its samples to the target over the synchronous reference's ({reference_label}), "
             f"measured in one run each of `{workload}` at N = {ACC_WORKERS} on this machine's network "
             "(accuracy.jsonl). The factor is applied at every N; the asynchronous PS's staleness grows with N, "
             "so beyond the N it was measured at it is optimistic.", "",
             "| configuration kind | measured at N | samples to target | reference's samples | factor |",
             "|---|---|---|---|---|"]
    for kind, m in (measured or {}).items():
        s = "" if m["samples_to_target"] is None else f"{m['samples_to_target']:.0f}"
        r = "" if m["reference_samples"] is None else f"{m['reference_samples']:.0f}"
        f = f"{m['factor']:.2f}" if m["factor"] is not None and math.isfinite(m["factor"]) else f"none: {m['reason']}"
        lines.append(f"| {kind} | {ACC_WORKERS} | {s} | {r} | {f} |")
    return lines + [""]
