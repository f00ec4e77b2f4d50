"""Benchmark the allreduce building blocks: our ring against torch's gloo, a PS and MapReduce.

(`python -m testbed.bench network`: a real network's alpha and beta, testbed/bench/calibrate.py;
`python -m testbed.bench targets RUN.json ...`: the targets over several runs, testbed/bench/judge.py;
`python -m testbed.bench models`: the real models' step time, testbed/bench/modeltimes.py;
`python -m testbed.bench startup`: how long a run takes to start, testbed/bench/startup.py.)

    python -m testbed.bench allreduce --workers 2,4,8 --sizes 4KB,256KB,4MB,64MB \\
        [--repeats 5] [--warmup 2] [--seed 0] [--timeout 120] [--out FILE.json]

For every worker count N one set of actors (and one torch gloo process group) is created and
reused for every size. Each worker holds a float32 buffer of size/4 seeded random elements;
every method must leave the elementwise sum of all N buffers where its users need it, and
before timing, each method's result is checked once against the numpy sum (a mismatch aborts).

Methods (each one full allreduce-equivalent round on the same actors):
  ring-objstore  our ring (ring.py schedule, peer.py ring_allreduce) over the object-store
                 transport: each chunk goes through a shared-memory ring buffer to the right
                 neighbour (channels.py, shm.py), zero-copy on the receiving side.
  ring-calls     the same ring with one `deliver` actor call per chunk (the object-store
                 transport without channels), to show what a Ray call per message costs.
  ring-torch     the same ring over torch.distributed isend/recv (gloo point-to-point).
  gloo           torch.distributed.all_reduce with gloo in the same process group: the
                 library baseline every ratio is taken against.
  ps             one parameter-server shard with sum semantics: every worker pushes its
                 buffer, then pulls the sum back into its buffer (push + pull, N*K in, N*K out).
  driver-sum     a MapReduce round: the driver ray.put's a K-byte broadcast once (the previous round's sum, as it
                 broadcasts parameters), every worker fetches it into its replica and returns its
                 buffer, the driver sums the N buffers. Timed on the driver.

Definitions (as in nccl-tests, doc/PERFORMANCE.md):
  time   median over --repeats of one round's wall time: last worker's end - first worker's
         start, all workers released together by a start gate (see benchlib); p10/p90 too.
  algbw  = S / time, S the buffer size in bytes.
  busbw  = algbw * 2(N-1)/N, the allreduce's bus factor: the per-link rate a ring would need,
         comparable across N and against hardware peak. The same factor is applied to every
         method (it belongs to the operation, not the algorithm), so busbw ratios = time ratios.
  ratio  time / gloo's time for the same (N, size); > 1 is slower than gloo.
  cpu    median CPU-seconds one round costs, summed over the processes doing it (workers'
         whole processes during the op, the PS shard, the MapReduce driver; not Ray's daemons).
         With C cores, time >= cpu / C (the "CPU floor"): where time is close to that, the
         method is CPU-bound.

Latency check: a 4 KiB ping-pong between ranks 0 and 1 through the object-store transport's
exchange, over a channel pair (ring-objstore's path) and over actor calls (ring-calls'); one
hop = RTT/2 (median). Each ring's time at the smallest size is compared with 2(N-1) hops on
its own path, the alpha term of the ring's cost model. "idle": ranks 0 and 1 ping while the
other N-2 peers wait (the target's definition); "loaded": every pair (0,1), (2,3), ... pings
at once (N >= 4), so all peers are busy as in a ring step. On fewer cores than peers the ring's
steps also queue for the CPU, so the line adds its CPU floor (cpu / cores).

Numbers are what this machine does: N workers share its cores (one torch thread each), so
they measure contention honestly, not a cluster. Sizes parse like every size flag (4KB = 4000
bytes, 4KiB = 4096). Ray: an initialized Ray is reused and left running; otherwise
testbed.runtime.cluster starts an embedded one and stops it at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any

import numpy as np

from testbed.bench import calibrate, gpu, judge, modeltimes, startup
from testbed.bench.report import derive, latency_entry, report, targets
from testbed.config import MAX_WORKERS, ConfigError
from testbed.util.units import format_bytes, format_seconds, parse_size

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
PROG = "python -m testbed.bench"
SCHEMA = "testbed.bench/1"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    a = sub.add_parser("allreduce", help="ring vs gloo vs PS vs MapReduce allreduce").add_argument
    a("--workers", default="2,4,8", help="comma-separated worker counts, e.g. 2,4,8")
    a("--sizes", default="4KB,256KB,4MB,64MB", help="comma-separated buffer sizes, e.g. 4KB,64MiB")
    a("--repeats", type=int, default=5, help="timed rounds per (N, size, method)")
    a("--warmup", type=int, default=2, help="untimed rounds before them")
    a("--seed", type=int, default=0, help="seed of the buffers' random data")
    a("--timeout", type=float, default=120.0, help="seconds any remote wait may take")
    a("--out", default=None, help="also write raw samples and derived numbers to this JSON file")
    a("--device", default="cpu", help="where the buffers live: cpu, or cuda (the workers share the "
                                      "machine's GPUs; gloo reduces CUDA tensors through the host)")
    calibrate.add_arguments(sub)
    gpu.add_arguments(sub)
    modeltimes.add_arguments(sub)
    startup.add_arguments(sub)
    judge.add_arguments(sub)
    return p


LIST_EXAMPLES = {"--workers": "2,4,8", "--cuda-workers": "1,2", "--cpu-workers": "2,4,8",
                 "--sizes": "4KB,64MB", "--paths": "channel,call", "--stages": "machine,tests",
                 "--workloads": modeltimes.DEFAULT_WORKLOADS, "--cases": startup.DEFAULT_CASES}


def _split(flag: str, text: str) -> list[str]:
    items = [x.strip() for x in text.split(",")]
    if not text.strip() or any(not x for x in items):
        raise ConfigError(f"{flag} {text!r}: give a comma-separated list without empty items, e.g. "
                          f"{LIST_EXAMPLES.get(flag, '4KB,64MB')}")
    return items


VALUE_FLAGS = frozenset(LIST_EXAMPLES)  # lists whose first item may begin with '-' ("-4KiB")


def _joined(argv: list[str]) -> list[str]:
    """ARGV with `--sizes -4KiB` as `--sizes=-4KiB`: argparse takes a value that begins with '-'
    for an option and answers 'expected one argument'; joined, the value reaches its own check
    (a size must be positive) and is refused with that rule."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in VALUE_FLAGS and i + 1 < len(argv) and argv[i + 1].startswith("-") \
                and argv[i + 1] not in ("-h", "--help") and not argv[i + 1].startswith("--"):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def parse_sizes(text: str) -> list[int]:
    """--sizes: comma-separated sizes, each a positive multiple of 4 bytes (float32 elements)."""
    sizes = []
    for item in _split("--sizes", text):
        try:
            size = parse_size(item, flag="--sizes")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if size < 4 or size % 4:
            raise ConfigError(f"--sizes {item!r}: is {size} bytes; use a positive multiple of 4 bytes "
                              "(float32 elements), e.g. 4KB or 4KiB")
        sizes.append(size)
    return sizes


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """argv -> validated options (raises ConfigError with the one-line message)."""
    ns = build_parser().parse_args(None if argv is None else _joined(list(argv)))
    if ns.command is None:
        raise ConfigError(f"missing benchmark: use '{PROG} allreduce --workers 2,4 --sizes 4KB', "
                          f"'{PROG} network', '{PROG} models', '{PROG} startup', '{PROG} gpu --out DIR' or "
                          f"'{PROG} targets RUN.json ...'")
    if ns.command == "gpu":  # --out is a folder there
        gpu.validate(ns, _split, parse_sizes)
        return ns
    if ns.command == "targets":  # reads the runs' --out files
        judge.validate(ns, SCHEMA)
        return ns
    if ns.out is not None:
        parent = os.path.dirname(os.path.abspath(ns.out))
        if os.path.isdir(ns.out) or not os.path.isdir(parent):
            raise ConfigError(f"--out {ns.out!r}: give a file path in an existing folder, e.g. bench.json")
    if ns.command == "network":
        calibrate.validate(ns, _split, parse_sizes)
        return ns
    if ns.command == "models":
        modeltimes.validate(ns, _split)
        return ns
    if ns.command == "startup":
        startup.validate(ns, _split)
        return ns
    workers = []
    for item in _split("--workers", ns.workers):
        if not item.isdigit() or not 2 <= int(item) <= MAX_WORKERS:
            raise ConfigError(f"--workers {item!r}: use integers in 2..{MAX_WORKERS}, e.g. 2,4,8")
        workers.append(int(item))
    sizes = parse_sizes(ns.sizes)
    if ns.repeats < 1:
        raise ConfigError(f"--repeats {ns.repeats!r}: use a positive integer, e.g. 5")
    if ns.warmup < 0:
        raise ConfigError(f"--warmup {ns.warmup!r}: use an integer >= 0, e.g. 2")
    if not 0 <= ns.seed < 2**32:
        raise ConfigError(f"--seed {ns.seed!r}: use an integer in 0..2**32-1")
    if not (ns.timeout > 0 and np.isfinite(ns.timeout)):
        raise ConfigError(f"--timeout {ns.timeout!r}: use a finite number of seconds > 0, e.g. 120")
    ns.workers, ns.sizes = sorted(set(workers)), sorted(set(sizes))
    _check_memory(ns.workers, ns.sizes)
    check_device(ns.device)
    return ns


def check_device(device: str) -> None:
    """--device: cpu, or cuda on a machine whose driver lists a GPU."""
    from testbed.runtime.cluster import local_machine

    if device not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device!r}: use cpu or cuda")
    if device == "cuda" and local_machine()["GPU"] < 1:
        raise ConfigError("--device 'cuda': this machine has no GPU that torch can use; use --device cpu")


def _check_memory(workers: list[int], sizes: list[int]) -> None:
    # Per size: each worker holds data + work + replica + a transient copy, the object store
    # holds pushes/pulls/returns (~3 per worker) and the driver the expected sum and N returns.
    from testbed.runtime.cluster import local_machine

    n, s = max(workers), max(sizes)
    need = s * (8 * n + 4)
    have = local_machine()["memory"]
    if need > have:
        raise ConfigError(f"--sizes {format_bytes(s)} with --workers {n}: needs about "
                          f"{need / 2**30:.1f} GiB of memory, the machine has {have / 2**30:.1f} GiB; "
                          "use smaller sizes or fewer workers")


def machine() -> dict[str, Any]:
    import ray
    import torch

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cpus": os.cpu_count(), "memory_bytes": mem, "platform": platform.platform(),
            "processor": platform.machine(), "python": platform.python_version(),
            "numpy": np.__version__, "torch": torch.__version__, "ray": ray.__version__}


def write_json(path: str, doc: dict[str, Any]) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    os.replace(tmp, path)  # atomic: a reader never sees half a file


def run_allreduce(ns: argparse.Namespace) -> dict[str, Any]:
    from testbed.bench.lib import LEFT_OUT_ON_CUDA, Runner, methods
    from testbed.config import ClusterConfig
    from testbed.runtime.cluster import Cluster

    cluster = Cluster(ClusterConfig(timeout_s=ns.timeout, device=ns.device), workers=max(ns.workers), servers=1)
    cluster.precheck_local()
    rows: list[dict[str, Any]] = []
    lats: list[dict[str, Any]] = []
    from testbed.util.machine import busy_fraction, system_cpu_s

    busy_before = busy_fraction(1.0)  # before Ray and our actors add their own load
    sys0, wall0, ours = system_cpu_s(), time.time(), -sum(os.times()[:2])
    with cluster:
        mach = machine()
        for n in ns.workers:
            runner = Runner(cluster, n, seed=ns.seed, timeout=ns.timeout, device=ns.device)
            try:
                loads = (False, True) if n >= 4 else (False,)  # "loaded" needs two pairs at least
                hops = {(calls, loaded): runner.hop_latency(calls, loaded)
                        for calls in (False, True) for loaded in loads}
                for size in ns.sizes:
                    runner.load(size)
                    found = {}
                    for method in methods(ns.device):
                        t0 = time.time()
                        found[method] = derive(n, size, method,
                                               runner.measure(method, size, ns.warmup, ns.repeats))
                        print(f"  N={n} {format_bytes(size)} {method}: "
                              f"{format_seconds(found[method]['median_s'])} "
                              f"({time.time() - t0:.1f}s wall)", file=sys.stderr, flush=True)
                    for r in found.values():
                        r["ratio_to_gloo"] = r["median_s"] / found["gloo"]["median_s"]
                        rows.append(r)
                for (calls, loaded), samples in hops.items():
                    lats.append(latency_entry(n, samples, rows, "ring-calls" if calls else "ring-objstore",
                                              loaded))
                gate_retries = runner.retries
            finally:
                ours += runner.close()
            print(f"  N={n} done (start-gate retries: {gate_retries})", file=sys.stderr, flush=True)
        ours += sum(os.times()[:2])  # the driver's share since sys0
        sys1, wall1 = system_cpu_s(), time.time()
    mach["busy_before"] = busy_before
    if sys0 is not None and sys1 is not None and busy_before is not None:
        mach["other_cpu_share"] = max(0.0, (sys1 - sys0 - ours) / ((wall1 - wall0) * (os.cpu_count() or 1)))
    if ns.device == "cuda":
        mach["gpu"] = cuda_name()
    return {"schema": SCHEMA, "command": [PROG, *ns.argv], "created": time.time(), "machine": mach,
            "args": {k: v for k, v in vars(ns).items() if k != "argv"}, "results": rows,
            "latency": lats, "targets": targets(rows, lats),
            "left_out": LEFT_OUT_ON_CUDA if ns.device == "cuda" else {}}


def cuda_name() -> str:
    import torch

    return f"{torch.cuda.get_device_name(0)} (torch {torch.__version__}, CUDA {torch.version.cuda})"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        ns = parse_args(argv)
    except ConfigError as exc:
        print(f"testbed.bench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    ns.argv = argv
    from testbed.bench.lib import ResultMismatch

    if ns.command == "network":
        return _network(ns)
    if ns.command == "models":
        doc = modeltimes.run_models(ns)
        return _emit(ns, doc, modeltimes.report(doc))
    if ns.command == "gpu":
        return gpu.run(ns)
    if ns.command == "targets":
        return judge.run(ns)
    if ns.command == "startup":
        doc = startup.run_startup(ns)
        failed = f"{len(doc['errors'])} run(s) failed; see the error lines above" if doc["errors"] else None
        return _emit(ns, doc, startup.report(doc), failed=failed)
    try:
        doc = run_allreduce(ns)
    except ConfigError as exc:  # resource shortfall found by the cluster check
        print(f"testbed.bench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ResultMismatch as exc:  # a wrong sum: no timing of it is worth printing
        print(f"testbed.bench: error: {exc}", file=sys.stderr)
        return 1
    return _emit(ns, doc, report(doc))


def _emit(ns: argparse.Namespace, doc: dict[str, Any], text: str, wrote: str = "",
          failed: str | None = None) -> int:
    """Print a benchmark's report, write its document to --out, say it; exit 1 with FAILED's line."""
    print(text)
    if ns.out:
        write_json(ns.out, doc)
        print(f"wrote {ns.out}{wrote}")
    if failed:
        print(f"testbed.bench: error: {failed}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _network(ns: argparse.Namespace) -> int:
    try:
        doc = calibrate.run_network(ns, PROG)
    except ConfigError as exc:
        print(f"testbed.bench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return _emit(ns, doc, calibrate.report(doc),
                 wrote=f" (use it with python -m testbed.run --calibration {ns.out})",
                 failed=None if doc["paths"] else "no path could be fitted; see the lines above")


if __name__ == "__main__":
    raise SystemExit(main())
