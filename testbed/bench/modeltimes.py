"""The real models' step time on this machine: one worker's forward + backward, alone and beside others.

    python -m testbed.bench models [--workloads resnet,transformer,mlp] [--workers 1,8]
        [--steps 10] [--warmup 2] [--out FILE.json]

For every workload (its default configuration: `python -m testbed.run --workload NAME`) and
worker count W, W processes (no Ray) each build the workload with one torch thread -- what a
worker actor does at its default CPU share -- wait at a common gate, then compute --warmup
untimed and --steps timed gradients of their own batches. Two times per (workload, W): `step`,
one gradient's wall time in one process (the median over every process and step, p10/p90
beside), and `together`, the wall time from the gate until the last process finished, over
--steps: how long one step of all W workers takes when they run side by side.

The model beside `together`: W workers sharing C cores each get C/W of a core once W > C, so a
step of all of them takes max(1, W/C) times the single-worker step. Where the measurement is
above that the machine loses more than its cores to the contention (caches, memory bandwidth,
the scheduler); the report says by how much.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from typing import Any

import numpy as np

from testbed.config import ConfigError

DEFAULT_WORKLOADS = "resnet,transformer,mlp"


def add_arguments(sub: Any) -> None:
    a = sub.add_parser("models", help="the real models' step time, alone and beside other workers").add_argument
    a("--workloads", default=DEFAULT_WORKLOADS, help="comma-separated workloads, e.g. resnet,transformer")
    a("--workers", default="1,8", help="comma-separated worker counts, e.g. 1,8")
    a("--steps", type=int, default=10, help="timed gradients per process")
    a("--warmup", type=int, default=2, help="untimed gradients before them")
    a("--out", default=None, help="also write raw samples and derived numbers to this JSON file")


def validate(ns: argparse.Namespace, split: Any) -> None:
    from testbed.config.workloadnames import WORKLOADS

    ns.workloads = split("--workloads", ns.workloads)
    real = [w for w in WORKLOADS if w != "synthetic"]
    bad = [w for w in ns.workloads if w not in real]
    if bad:
        raise ConfigError(f"--workloads {bad[0]!r}: choose among {', '.join(real)} (the real models)")
    counts = split("--workers", ns.workers)
    if any(not c.isdigit() or not 1 <= int(c) <= 64 for c in counts):
        raise ConfigError(f"--workers {ns.workers!r}: use integers in 1..64, e.g. 1,8")
    ns.workers = sorted({int(c) for c in counts})
    if ns.steps < 1:
        raise ConfigError(f"--steps {ns.steps!r}: use a positive integer, e.g. 10")
    if ns.warmup < 0:
        raise ConfigError(f"--warmup {ns.warmup!r}: use an integer >= 0, e.g. 2")


def _worker(name: str, rank: int, workers: int, steps: int, warmup: int, gate: Any, out: Any) -> None:
    from testbed.config import RunConfig, with_overrides
    from testbed.runtime.worker import limit_threads
    from testbed.workloads import make_workload

    limit_threads(1)
    cfg = with_overrides(RunConfig(workers=workers), **{"workload.name": name})
    model = make_workload(cfg.workload, seed=cfg.seed, workers=workers)
    for i in range(warmup):
        model.gradient(model.batch(rank, i))
    gate.wait()
    start, times = time.time(), []
    for i in range(warmup, warmup + steps):
        t0 = time.perf_counter()
        model.gradient(model.batch(rank, i))
        times.append(time.perf_counter() - t0)
    out.put((rank, model.numel, times, start, time.time()))


def measure(name: str, workers: int, steps: int, warmup: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    gate, out = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(name, r, workers, steps, warmup, gate, out), daemon=True)
             for r in range(workers)]
    for p in procs:
        p.start()
    got = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(10)
    samples = [t for g in got for t in g[2]]
    s = np.asarray(samples)
    together = (max(g[4] for g in got) - min(g[3] for g in got)) / steps
    return {"workload": name, "workers": workers, "params": got[0][1], "samples_s": samples,
            "median_s": float(np.median(s)), "p10_s": float(np.percentile(s, 10)),
            "p90_s": float(np.percentile(s, 90)), "together_s": together}


def run_models(ns: argparse.Namespace) -> dict[str, Any]:
    cores = os.cpu_count() or 1
    rows = []
    for name in ns.workloads:
        single = None
        for w in ns.workers:
            row = measure(name, w, ns.steps, ns.warmup)
            if w == 1:
                single = row["together_s"]
            row["model_s"] = None if single is None else single * max(1.0, w / cores)
            rows.append(row)
    return {"cores": cores, "rows": rows}


def report(doc: dict[str, Any]) -> str:
    lines = [f"cores: {doc['cores']}; one torch thread per worker; batch 32 (the defaults)",
             f"{'workload':<12} {'params':>8} {'W':>3} {'step':>10} {'p10':>10} {'p90':>10} "
             f"{'together':>10} {'model':>10} {'vs model':>9}"]
    for r in doc["rows"]:
        model = r["model_s"]
        ratio = "-" if model is None else f"{r['together_s'] / model:.2f}x"
        lines.append(f"{r['workload']:<12} {r['params']:>8} {r['workers']:>3} {r['median_s'] * 1e3:>8.1f}ms "
                     f"{r['p10_s'] * 1e3:>8.1f}ms {r['p90_s'] * 1e3:>8.1f}ms {r['together_s'] * 1e3:>8.1f}ms "
                     f"{'-' if model is None else f'{model * 1e3:.1f}ms':>10} {ratio:>9}")
    lines.append("step: one gradient in one process; together: one step of all W side by side "
                 "(wall / steps); model: max(1, W/cores) x together at W = 1")
    return "\n".join(lines)
