"""Every rule a RunConfig must pass before Ray starts; a failure is one ConfigError line.

Generic rules come from the fields themselves (their declared checks) and from what
strategies say about themselves: `specs` maps each strategy name to its `StrategySpec`
(`testbed.strategies.registry.SPECS`), which declares the keys it reads, the choices of its own keys, how
many servers it places and any rule of its own. A strategy-specific key given to a strategy
that does not read it is an error, not silently ignored. No strategy is named here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from testbed.config.calibration import load_calibration
from testbed.config.datafiles import probe
from testbed.config.environment import AUTO
from testbed.config.faultspec import check_faults
from testbed.config.schema import (
    ConfigError,
    RunConfig,
    default_of,
    flag_of,
    get,
    leaves,
    shown,
)
from testbed.config.workload import APPLIES, FROM_DATA


def fail(key_or_flag: str, value: Any, fix: str) -> None:
    """Raise the one-line error: the flag, the value as the user wrote it, the fix."""
    flag = key_or_flag if key_or_flag.startswith("--") else flag_of(key_or_flag)
    raise ConfigError(f"{flag} {shown(value)!r}: {fix}")


def owners(specs: Mapping[str, Any], key: str) -> list[str]:
    """Strategies that read a strategy-specific key."""
    return [name for name, spec in specs.items() if key in spec.keys]


def strategy_keys(specs: Mapping[str, Any]) -> set[str]:
    """Keys that some strategy declares as its own (all other keys apply to every strategy)."""
    return set().union(*(spec.keys for spec in specs.values()))


def validate(cfg: RunConfig, specs: Mapping[str, Any]) -> RunConfig:
    """Check every rule; return cfg with its automatic choices made (`auto_workers_per_process`,
    and --dilation left out: `NetworkConfig.resolved`), or raise ConfigError."""
    if cfg.strategy not in specs:
        fail("strategy", cfg.strategy, f"choose one of {', '.join(sorted(specs))}")
    spec = specs[cfg.strategy]
    for key, f in leaves():
        check, value = f.metadata.get("check"), get(cfg, key)
        if check is not None and value is not None:
            fix = check(value)
            if fix:
                fail(key, value, fix)
    for key in sorted(strategy_keys(specs) - set(spec.keys)):
        if get(cfg, key) != default_of(key):
            fail(key, get(cfg, key), f"applies to --strategy {'/'.join(owners(specs, key))} only "
                 f"(got {cfg.strategy}); drop it")
    for key, options in spec.choices.items():
        if get(cfg, key) not in options:
            fail(key, get(cfg, key), f"choose one of {', '.join(options)}")
    _validate_workload(cfg)
    _validate_network(cfg)
    _validate_workers_named(cfg, spec.servers(cfg))
    _validate_out(cfg.out)
    if cfg.cluster.address is not None and not cfg.cluster.address.strip():
        fail("cluster.address", cfg.cluster.address, "use 'auto' or HOST:PORT of a running Ray head")
    for f in cfg.faults.fail.items:
        if f.target == "worker" and f.kind not in spec.fault_kinds:
            fail("faults.fail", f.to_text(), f"--strategy {cfg.strategy} workers cannot fire '{f.kind}' "
                 f"faults; use one of {', '.join(spec.fault_kinds)}")
    cfg = _resolve_real_workers(cfg, spec)
    if cfg.cluster.workers_per_process is None:
        k = auto_workers_per_process(cfg, specs)
        cfg = replace(cfg, cluster=replace(cfg.cluster, workers_per_process=k))
    cfg = replace(cfg, network=cfg.network.resolved(cfg.workload.real_compute))
    _validate_hosting(cfg, specs)
    spec.validate(cfg)
    return cfg


AUTO_ALL_REAL = 16  # --real-workers auto: every worker real up to this many workers
AUTO_REAL = 16  # beyond, this many real workers where the run can have emulated peers
AUTO_MESSAGES = 2400  # and fewer where their calls per step would pass this many (_auto_real)
AUTO_ALONE = 16  # up to this many workers, the automatic choice is one process per worker
AUTO_PROCESSES = 8  # beyond, the most worker processes it starts on one local Ray


def auto_workers_per_process(cfg: RunConfig, specs: Mapping[str, Any]) -> int:
    """--workers-per-process left out: one process per worker up to AUTO_ALONE workers, on a
    Ray cluster (--address or RAY_ADDRESS: there each worker is a real machine's process), and
    wherever sharing a process is refused (`sharing_refused`); otherwise
    ceil(N / AUTO_PROCESSES), so N = 64 starts 8 processes instead of 64.

    Why: on 2 cores a worker process costs about 0.5-0.7 s to start and 90-100 MiB, and ps-sync
    at N = 64 took 32 s and 6.3 GiB to start 65 processes against 1.7 s and 2.1 GiB for 5, with
    the same fidelity (docs/emulation.md, "Many workers on one box"). Why 8 beyond 16 workers: the fidelity
    sweeps (experiments/fidelity.toml, N = 8..128 in at most 8 processes) are within 5% of the
    model there, and the ring at N = 64 reached its first update in 13.7 s in 8 processes against
    19.9 s in 16 (actors 5.2 s against 10.3 s, steps 1.5 s against 2.4 s on the real transport: 16
    processes on 2 cores mostly wait for each other). Up to 16 workers nothing changes, so every
    run of the earlier versions at N <= 16 (the regression baselines among them) is the same."""
    n = cfg.real_workers  # processes host the real workers only (testbed.emulation.peers)
    if (n <= AUTO_ALONE or cfg.cluster.address or os.environ.get("RAY_ADDRESS")
            or sharing_refused(cfg, specs[cfg.strategy])):
        return 1
    return -(-n // AUTO_PROCESSES)


def sharing_refused(cfg: RunConfig, spec: Any) -> str | None:
    """Why this run's workers cannot share a process, with the fix (testbed.runtime.hosting), or None."""
    why = spec.cannot_share_processes(cfg)
    if why:
        return f"--strategy {cfg.strategy}: {why}; use 1"
    if cfg.workload.real_compute:
        return (f"--workload {cfg.workload.name} computes for real, and workers sharing a process would "
                "take turns on one interpreter; use 1, or --workload synthetic --compute-ms MS")
    if cfg.faults.fail.items:
        return "an injected fault would take every worker of its process down; use 1 with --fail"
    if spec.colocated_servers(cfg):
        return "a colocated server sits in its worker's process slot; use 1 with --ps-placement colocated"
    return None


def _validate_hosting(cfg: RunConfig, specs: Mapping[str, Any]) -> None:
    """--workers-per-process K > 1: what sharing a process would change (testbed.runtime.hosting)."""
    k = cfg.cluster.workers_per_process
    if k == 1:
        return
    why = sharing_refused(cfg, specs[cfg.strategy])
    if why:
        fail("cluster.workers_per_process", k, why)
    if k > cfg.real_workers:
        fail("cluster.workers_per_process", k, f"there are only {cfg.real_workers} real workers; use at most "
             f"{cfg.real_workers}")


def _auto_real(cfg: RunConfig, spec: Any) -> int:
    """--real-workers auto beyond AUTO_ALL_REAL workers: AUTO_REAL, or fewer where each real
    worker makes many calls per step (`messages_per_step`): at most AUTO_MESSAGES of them in all,
    and at least one real worker. Every call costs this machine CPU that the emulated clock does
    not see, and a peer's messages ride on its owner's. Why 2,400: ps-sync --workers 128
    --ps-shards 8 --grad-mb 1200 --bandwidth 25Gbit --compute-ms 500 (300 partitions, 600 calls
    per worker and step) measured 2.24x the model's communication at D = 1 with 16 real workers
    (9,600 calls per step), 1.12x with 8 (4,800), and 0.996x with 4 (2,400), faithful in 49 s
    where the search from 16 took 4.6 min. At the sweeps' 100 MiB in 4 MiB partitions (50 calls)
    it leaves 16."""
    calls = spec.messages_per_step(cfg)
    if not calls:
        return AUTO_REAL
    return max(1, min(AUTO_REAL, AUTO_MESSAGES // calls))


def _resolve_real_workers(cfg: RunConfig, spec: Any) -> RunConfig:
    """--real-workers: auto made a count (every worker up to AUTO_ALL_REAL, beyond, `_auto_real` where
    the run can have emulated peers), a count checked against the run (testbed.emulation.peers)."""
    k, n = cfg.cluster.real_workers, cfg.workers
    why = spec.cannot_emulate_peers(cfg)
    if k is None or k == AUTO:
        can = cfg.network.emulated and not why and not cfg.faults.fail.items
        return replace(cfg, cluster=replace(cfg.cluster, real_workers=_auto_real(cfg, spec) if can and n > AUTO_ALL_REAL
                                            else n))
    if k > n:
        fail("cluster.real_workers", k, f"there are only {n} workers (--workers {n}); use at most {n}, or auto")
    if k == n:
        return cfg
    if not cfg.network.emulated:
        fail("cluster.real_workers", k, f"emulated peers send at the emulated network's times; add --bandwidth, "
             f"e.g. 10Gbit, or use --real-workers {n}")
    if why:
        fail("cluster.real_workers", k, f"--strategy {cfg.strategy} {why}; use --real-workers {n} (every worker real)")
    if cfg.faults.fail.items:
        fail("cluster.real_workers", k, f"an injected fault needs every worker real; use --real-workers {n} "
             "with --fail")
    return cfg


def _given(key: str, cfg: RunConfig) -> bool:
    return get(cfg, key) != default_of(key)


def _validate_workload(cfg: RunConfig) -> None:
    w = cfg.workload
    if w.payload.scale != 1.0 and w.real_compute:
        fail("workload.payload", w.payload, "only the synthetic workload has a scalable payload")
    if w.profile is not None and _given("workload.grad_mb", cfg):
        fail("workload.grad_mb", w.grad_mb, f"--workload {w.name} has the model's own "
             "gradient size; drop --grad-mb (or use --workload synthetic)")
    for key, readers in APPLIES.items():
        if w.name not in readers and _given(f"workload.{key}", cfg):
            fail(f"workload.{key}", get(cfg, f"workload.{key}"),
                 f"applies to --workload {'/'.join(readers)} only (got {w.name}); drop it")
    if w.optimizer != "momentum" and _given("workload.momentum", cfg):
        fail("workload.momentum", w.momentum, f"applies to --optimizer momentum only (got {w.optimizer}); drop it")
    if w.name == "transformer" and w.d_model % w.heads:
        fail("workload.heads", w.heads, f"must divide --d-model {w.d_model}; use e.g. "
             f"{max(h for h in range(1, w.heads + 1) if w.d_model % h == 0)}")
    if w.data is not None:
        _validate_data(cfg)
    if cfg.eval.target_acc is not None and not w.real_compute:
        fail("eval.target_acc", cfg.eval.target_acc, f"--workload {w.name} has no accuracy (it is a "
             "quadratic objective); use --target-loss")
    targets = [f for f, v in (("--target-loss", cfg.eval.target_loss), ("--target-acc", cfg.eval.target_acc))
               if v is not None]
    if cfg.eval.every == 0 and targets:
        fail("eval.every", 0, f"{' and '.join(targets)} is measured on held-out evaluations, which 0 "
             "turns off; drop --eval-every 0 (or give K > 0), or drop the target")


def _validate_data(cfg: RunConfig) -> None:
    """--data: a readable file of a format its workload trains on, before anything starts."""
    w = cfg.workload
    try:
        info = probe(w.data, w.seq_len)
    except ValueError as exc:
        fail("workload.data", w.data, str(exc))
    wanted = "text" if w.name == "transformer" else "images"
    if info.images != (wanted == "images"):
        readers = "transformer" if not info.images else "resnet, mlp or logreg"
        fail("workload.data", w.data, f"{info.kind} data trains --workload {readers} (got {w.name})")
    for key in FROM_DATA:
        if _given(f"workload.{key}", cfg):
            fail(f"workload.{key}", get(cfg, f"workload.{key}"), f"--data {w.data} fixes it ({info.kind}); drop it")


def _validate_network(cfg: RunConfig) -> None:
    n = cfg.network  # (its rate and latency were parsed when it was built)
    if n.bandwidth is None and n.latency_s > 0:
        fail("network.latency", n.latency, "emulation needs a bandwidth too; add --bandwidth, e.g. 10Gbit")
    if n.dilation not in (None, 1.0) and n.bandwidth is None:
        fail("network.dilation", n.dilation, "dilation stretches an emulated network; add --bandwidth, "
             "e.g. 10Gbit, or drop --dilation")
    if n.calibration is not None:
        if n.bandwidth is not None:
            fail("network.calibration", n.calibration, "a calibration describes the real network; drop "
                 "--bandwidth (emulated) or --calibration")
        try:
            load_calibration(n.calibration)
        except ValueError as exc:
            fail("network.calibration", n.calibration, str(exc))
    if n.dilation not in (None, 1.0) and cfg.workload.real_compute:
        fail("network.dilation", n.dilation, f"--workload {cfg.workload.name} computes for real and real "
             "compute cannot be slowed down; use --workload synthetic --compute-ms MS, or drop --dilation")


def _validate_workers_named(cfg: RunConfig, servers: int) -> None:
    """Stragglers and faults may only name workers (and servers) that exist."""
    for spec in cfg.straggler:
        worker = getattr(spec, "worker", None)
        if worker is not None and worker >= cfg.workers:
            fail("straggler", cfg.straggler, f"there is no worker {worker}; use a worker in "
                 f"0..{cfg.workers - 1} (--workers {cfg.workers})")
    try:
        check_faults(tuple(cfg.faults.fail), workers=cfg.workers, servers=servers, steps=cfg.steps)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


NAME_MAX, PATH_MAX = 255, 4096  # Linux's limits, where the file system does not say its own
RUN_FOLDER_ROOM = 128  # what a run adds below --out: its run id, then its files' names


def path_too_long(path: str, room: int = 0) -> str | None:
    """Why PATH (plus `room` bytes that will be added below it) cannot be created on this file
    system: a component longer than the file system's name limit, or the whole longer than its
    path limit; None if it fits. Asked before anything is created, so no OSError 36 later."""
    full = os.path.abspath(path)
    probe = full
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    def limit(name: str, default: int) -> int:
        try:
            return int(os.pathconf(probe, name))
        except (OSError, ValueError):
            return default
    name_max, path_max = limit("PC_NAME_MAX", NAME_MAX), limit("PC_PATH_MAX", PATH_MAX)
    longest = max(full.split(os.sep), key=lambda c: len(os.fsencode(c)))
    if len(os.fsencode(longest)) > name_max:
        return (f"a folder name of {len(os.fsencode(longest))} bytes ({longest[:24]}...) is longer than the "
                f"{name_max} this file system allows")
    size = len(os.fsencode(full)) + room
    if size > path_max:
        return (f"the path is {len(os.fsencode(full))} bytes, and with the {room} a run adds below it longer "
                f"than the {path_max} this system allows")
    return None


def _validate_out(out: str) -> None:
    too_long = path_too_long(out, RUN_FOLDER_ROOM)
    if too_long:
        fail("out", out, f"{too_long}; pick a shorter --out")
    path = os.path.abspath(out)
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        fail("out", out, f"{probe} is a file, not a folder; pick another --out")
    if not os.access(probe, os.W_OK | os.X_OK):
        fail("out", out, f"{probe} is not writable; pick a writable --out")
