"""The whole GPU check in one command: tests, what shares one GPU, allreduce and training on it.

    python -m testbed.bench gpu --out DIR [--stages machine,tests,matrix,runs,bench-cuda,bench-cpu]
        [--cuda-workers 2,4,8] [--cpu-workers auto] [--sizes 4KB,4MB,64MB] [--repeats 5]
        [--steps 30] [--stage-timeout 240]

Each stage runs in a process of its own with its own time limit, writes its log and results
into DIR as it goes and is recorded as ok, failed (with its last line) or skipped (with the
reason), so one broken stage never costs the others their numbers:

  machine     CPUs, memory, the GPU (nvidia-smi, torch), versions          (always)
  tests       `pytest -m gpu` (tests/ray/test_gpu.py: every synchronous strategy on CUDA equals
              single-process SGD on the same GPU, N = 1..4; NCCL's refusal of two ranks on one
              GPU), from a clone's tests/ folder                           (GPU)
  matrix      every strategy, and each value of its own choices (transports, algorithms,
              topologies), with 2 workers on one GPU, as `testbed.run` plans and runs it (the
              mlp on CUDA, a few steps): exit 0 with its throughput, or exit 2 with the one-line
              reason                                                        (GPU)
  runs        `python -m testbed.run --strategy S --workers 8 --device cuda --workload resnet
              --steps N` for the first synchronous strategy of the allreduce and the PS family
              (the ring, ps-sync): samples/s and the time split               (GPU)
  bench-cuda  `python -m testbed.bench allreduce --device cuda --workers W`   (GPU)
  bench-cpu   the same on the CPU at N <= the machine's cores (no oversubscription): the
              reference point beside it                                     (always)

DIR then holds gpu.json (every stage: status, reason, seconds, what it measured), gpu.md (the
report) and each stage's log and results. Without a GPU the GPU stages are skipped with the
reason and the command still exits 0; it exits 1 when a stage that ran failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from testbed.bench.gpureport import report
from testbed.config import MAX_WORKERS, ConfigError

STAGES = ("machine", "tests", "matrix", "runs", "bench-cuda", "bench-cpu")
NEEDS_GPU = frozenset({"tests", "matrix", "runs", "bench-cuda"})
CPU_WORKERS = (4, 8, 16)  # the CPU reference at N = 4, 8, 16 where the cores allow
RUN_FAMILIES = ("allreduce", "ps")  # the question's two families: the first synchronous strategy of each
SUMMARY_FIELDS = ("status", "device", "gpus_per_worker", "samples_per_s", "updates_per_s", "step_time_p50_s",
                  "compute_frac", "comm_frac", "wait_frac", "loss_first", "loss_last", "startup_s")


def add_arguments(sub: Any) -> None:
    a = sub.add_parser("gpu", help="the whole GPU check: tests, sharing one GPU, allreduce and "
                       "training on it, the CPU beside it").add_argument
    a("--out", required=True, help="folder for gpu.json, gpu.md and every stage's log (created)")
    a("--stages", default=",".join(STAGES), help=f"comma-separated, of {','.join(STAGES)}")
    a("--cuda-workers", default="2,4,8", help="worker counts of the GPU allreduce benchmark")
    a("--cpu-workers", default="auto", help="worker counts of the CPU benchmark; auto: 4,8,16 up "
      "to the machine's cores (2 if it has fewer than 4)")
    a("--sizes", default="4KB,4MB,64MB", help="buffer sizes of both allreduce benchmarks")
    a("--repeats", type=int, default=5, help="timed rounds per benchmark point")
    a("--steps", type=int, default=30, help="model updates of each resnet run (stage runs)")
    a("--stage-timeout", type=float, default=240.0, help="seconds one stage may take before it is stopped")


def validate(ns: argparse.Namespace, split: Any, parse_sizes: Any) -> None:
    """Check the options in place (ConfigError with the one-line fix)."""
    stages = split("--stages", ns.stages)
    bad = [s for s in stages if s not in STAGES]
    if bad:
        raise ConfigError(f"--stages {bad[0]!r}: use some of {','.join(STAGES)}")
    ns.stages = [s for s in STAGES if s in stages]
    ns.cuda_workers = _counts("--cuda-workers", split("--cuda-workers", ns.cuda_workers))
    cores = os.cpu_count() or 1
    if ns.cpu_workers == "auto":
        ns.cpu_workers = [n for n in CPU_WORKERS if n <= cores] or [2]
    else:
        ns.cpu_workers = _counts("--cpu-workers", split("--cpu-workers", ns.cpu_workers))
    ns.sizes = ",".join(split("--sizes", ns.sizes))
    parse_sizes(ns.sizes)  # the benchmark's own rule, checked before any stage starts
    for flag, value in (("--repeats", ns.repeats), ("--steps", ns.steps)):
        if value < 1:
            raise ConfigError(f"{flag} {value!r}: use a positive integer, e.g. 5")
    if not (ns.stage_timeout > 0 and ns.stage_timeout < float("inf")):
        raise ConfigError(f"--stage-timeout {ns.stage_timeout!r}: use a finite number of seconds > 0, e.g. 240")
    out = Path(ns.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {ns.out!r}: is a file; give a folder (it is created), e.g. gpu-check")
    if not out.parent.is_dir():
        raise ConfigError(f"--out {ns.out!r}: its parent folder does not exist; create it or pick another")


def _counts(flag: str, items: list[str]) -> list[int]:
    for item in items:
        if not item.isdigit() or not 2 <= int(item) <= MAX_WORKERS:
            raise ConfigError(f"{flag} {item!r}: use integers in 2..{MAX_WORKERS}, e.g. 2,4,8")
    return sorted({int(x) for x in items})


# ---- the stages


def gpu_reason() -> str | None:
    """None where torch sees a CUDA device, else why the GPU stages are skipped."""
    from testbed.runtime.cluster import nvidia_devices

    if not nvidia_devices():
        return "no NVIDIA GPU: the driver lists none (/proc/driver/nvidia/gpus)"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} cannot use the GPU (torch.cuda.is_available() is False: a CPU build?)"
    return None


def machine_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {
        "cpus": os.cpu_count(), "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "platform": platform.platform(), "python": platform.python_version(),
    }
    smi = shutil.which("nvidia-smi")
    if smi:
        q = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=60)
        facts["nvidia_smi"] = (q.stdout or q.stderr).strip()
    for name in ("torch", "ray", "numpy"):
        try:
            mod = __import__(name)
            facts[name] = mod.__version__
        except ImportError:
            facts[name] = None
    try:
        import torch

        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            facts.update(gpu=p.name, gpus=torch.cuda.device_count(), gpu_memory_bytes=p.total_memory,
                         cuda=torch.version.cuda, nccl=".".join(map(str, torch.cuda.nccl.version())))
    except ImportError:
        pass
    return facts


def _command(ns: argparse.Namespace, stage: str, out: Path) -> list[str] | None:
    """The process a stage runs (None: it runs here)."""
    py = [sys.executable]
    if stage == "tests":
        return [*py, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-n", "0", "-q", "-rA",
                f"--junitxml={out / 'tests.xml'}", str(tests_dir() / "ray" / "test_gpu.py")]
    if stage in ("bench-cuda", "bench-cpu"):
        device = stage.removeprefix("bench-")
        workers = ns.cuda_workers if device == "cuda" else ns.cpu_workers
        return [*py, "-m", "testbed.bench", "allreduce", "--device", device,
                "--workers", ",".join(map(str, workers)), "--sizes", ns.sizes, "--repeats", str(ns.repeats),
                "--out", str(out / f"{stage}.json")]
    if stage in ("matrix", "runs"):
        return [*py, "-m", "testbed.bench.gpu", stage, str(out), str(ns.steps)]
    return None


def tests_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "tests"


def _skip_reason(stage: str, no_gpu: str | None) -> str | None:
    if stage in NEEDS_GPU and no_gpu:
        return no_gpu
    if stage == "tests" and not (tests_dir() / "ray" / "test_gpu.py").exists():
        return f"{tests_dir()} is not there: run from a clone of the repository"
    return None


def run_stage(cmd: list[str], log: Path, timeout: float) -> tuple[int | None, str]:
    """Run cmd in a process group of its own, output to log; (exit code or None on timeout, last line)."""
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its Ray and actors with it
            proc.wait()
            code = None
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    return code, lines[-1] if lines else ""


def run(ns: argparse.Namespace) -> int:
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    no_gpu = gpu_reason()
    doc: dict[str, Any] = {"schema": "testbed.bench.gpu/1", "command": ["python -m testbed.bench", *ns.argv],
                           "created": time.time(), "stages": {}}
    failed = 0
    for stage in ns.stages:
        t0 = time.time()
        entry: dict[str, Any] = {"status": "ok"}
        why = _skip_reason(stage, no_gpu)
        if why:
            entry = {"status": "skipped", "reason": why}
        elif stage == "machine":
            entry["facts"] = machine_facts()
        else:
            cmd = _command(ns, stage, out)
            assert cmd is not None
            entry["command"] = cmd
            print(f"[{stage}] {' '.join(cmd)}", flush=True)
            code, last = run_stage(cmd, out / f"{stage}.log", ns.stage_timeout)
            entry["exit_code"], entry["last_line"] = code, last
            if code != 0:
                entry["status"] = "failed"
                entry["reason"] = (f"stopped after {ns.stage_timeout:g} s" if code is None
                                   else f"exit {code}: {last}")
                failed += 1
            entry.update(_results(stage, out))
        entry["wall_s"] = time.time() - t0
        doc["stages"][stage] = entry
        print(f"[{stage}] {entry['status']}" + (f": {entry['reason']}" if "reason" in entry else "")
              + f" ({entry['wall_s']:.0f} s)", flush=True)
        _write(out, doc)  # after every stage: a stop later keeps what was measured
    print(report(doc))
    print(f"wrote {out / 'gpu.json'} and {out / 'gpu.md'}")
    return 1 if failed else 0


def _write(out: Path, doc: dict[str, Any]) -> None:
    tmp = out / "gpu.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, out / "gpu.json")
    (out / "gpu.md").write_text(report(doc) + "\n")


def _results(stage: str, out: Path) -> dict[str, Any]:
    """What a stage left in DIR, read back for gpu.json."""
    if stage == "tests" and (out / "tests.xml").exists():
        return {"tests": junit_counts(out / "tests.xml")}
    path = out / f"{stage}.json"
    if stage != "tests" and path.exists():
        doc = json.loads(path.read_text())
        if stage.startswith("bench-"):
            return {"rows": [{k: r[k] for k in ("workers", "size_bytes", "method", "median_s", "busbw_Bps",
                                                "ratio_to_gloo", "cpu_s_median")} for r in doc["results"]],
                    "machine": doc["machine"], "left_out": doc.get("left_out", {})}
        return {"rows": doc}
    return {}


def junit_counts(path: Path) -> dict[str, Any]:
    import xml.etree.ElementTree as ET

    cases = ET.parse(path).getroot().iter("testcase")
    out: dict[str, Any] = {"passed": 0, "failed": 0, "skipped": 0, "failures": [], "skips": []}
    for case in cases:
        name = case.get("name", "?")
        if case.find("failure") is not None or case.find("error") is not None:
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            out["failed"] += 1
            out["failures"].append(f"{name}: {(bad.get('message') or '').splitlines()[0][:300] if bad.get('message') else ''}")
        elif case.find("skipped") is not None:
            out["skipped"] += 1
            out["skips"].append(f"{name}: {case.find('skipped').get('message', '')}")
        else:
            out["passed"] += 1
    return out


# ---- the matrix and the runs (each in the process `run_stage` starts)


def matrix_cases() -> list[tuple[str, dict[str, Any]]]:
    """Every registered strategy with its defaults, then with each other value of each of its
    own choices (the ring's transports and algorithms, gossip's topologies): (label, overrides)."""
    from testbed.strategies.registry import SPECS

    cases: list[tuple[str, dict[str, Any]]] = []
    for name, spec in SPECS.items():
        cases.append((name, {"strategy": name}))
        for key, values in spec.choices.items():
            cases += [(f"{name}, {key.split('.')[-1]} {v}", {"strategy": name, key: v}) for v in values[1:]]
    return cases


def run_strategies() -> list[str]:
    """The first synchronous strategy of each of RUN_FAMILIES, in registry order."""
    from testbed.config import RunConfig
    from testbed.strategies.registry import SPECS

    found = {}
    for name, spec in SPECS.items():
        if spec.family in RUN_FAMILIES and spec.synchronous(RunConfig(strategy=name)):
            found.setdefault(spec.family, name)
    return [found[f] for f in RUN_FAMILIES if f in found]


def matrix(out: Path, steps: int, device: str = "cuda") -> None:
    """Every `matrix_cases` row with 2 workers on the GPU, planned and run as `testbed.run` does,
    in one Ray (`device` cpu: the same rows on the CPU, to check this code where there is no GPU)."""
    import ray

    from testbed.config import ConfigError, validate, with_overrides
    from testbed.run import parse_args
    from testbed.runtime.rayprocs import start_ray
    from testbed.session.execute import execute
    from testbed.strategies.registry import SPECS

    rows = []
    folder = Path(tempfile.mkdtemp(prefix="gpu-matrix-"))
    started = False
    for label, overrides in matrix_cases():
        argv = ["--workers", "2", "--device", device, "--workload", "mlp", "--steps", str(min(steps, 10)),
                "--quiet", "--out", str(folder)]
        row: dict[str, Any] = {"case": label, "argv": argv, "overrides": overrides}
        t0 = time.time()
        try:
            cfg = validate(with_overrides(parse_args(argv), **overrides), SPECS)
            if not started:
                start_ray(None)
                started = True
            outcome = execute(cfg)
            row.update(exit_code=outcome.exit_code, line=outcome.error_line,
                       **{k: (outcome.summary or {}).get(k) for k in SUMMARY_FIELDS})
        except ConfigError as exc:  # what the command prints before Ray, with exit 2
            row.update(exit_code=2, line=str(exc))
        row["wall_s"] = time.time() - t0
        rows.append(row)
        print(f"{label}: exit {row['exit_code']}" + (f": {row['line']}" if row.get("line") else
                                                     f", {row.get('samples_per_s') or 0:.0f} samples/s"), flush=True)
        (out / "matrix.json").write_text(json.dumps(rows, indent=1, default=str))
    if started:
        ray.shutdown()
    shutil.rmtree(folder, ignore_errors=True)


def runs(out: Path, steps: int) -> None:
    """The main command on the GPU with a real model, as a user types it (a process each)."""
    rows = []
    for strategy in run_strategies():
        folder = Path(tempfile.mkdtemp(prefix="gpu-run-"))
        argv = ["--strategy", strategy, "--workers", "8", "--device", "cuda", "--workload", "resnet",
                "--steps", str(steps), "--quiet", "--out", str(folder)]
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "testbed.run", *argv], capture_output=True, text=True)
        err = [x for x in proc.stderr.splitlines() if x.strip()]
        row: dict[str, Any] = {"case": strategy, "argv": argv, "exit_code": proc.returncode,
                               "wall_s": time.time() - t0, "line": err[-1] if err else None,
                               "stderr": proc.stderr.strip()[-2000:]}
        found = list(folder.glob("*/summary.json"))
        if found:
            summary = json.loads(found[0].read_text())
            row.update({k: summary.get(k) for k in SUMMARY_FIELDS})
        rows.append(row)
        print(f"{strategy}: exit {proc.returncode}, {row.get('samples_per_s') or 0:.0f} samples/s", flush=True)
        (out / "runs.json").write_text(json.dumps(rows, indent=1, default=str))
        shutil.rmtree(folder, ignore_errors=True)
    if any(r["exit_code"] != 0 for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":  # a stage's own process (see _command)
    stage, folder, n_steps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    {"matrix": matrix, "runs": runs}[stage](folder, n_steps)
