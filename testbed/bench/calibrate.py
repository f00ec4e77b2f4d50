"""Measure a real network's alpha and beta for the cost model: the calibration file.

    python -m testbed.bench network [--sizes 4KiB,256KiB,4MiB] [--paths channel,call,torch]
        [--repeats 20] [--warmup 5] [--timeout 120] [--address HOST:PORT] [--out calibration.json]

Two bench peers (`testbed.bench.lib.Runner`, N = 2) time messages of each size between ranks 0
and 1 over each path the strategies' messages take (testbed.config.calibration: a channel
pair, actor calls, torch p2p); the one-way time of a size is the median of --repeats samples
after --warmup (p10 and p90 beside it), the statistics rules of the allreduce benchmark. The
alpha-beta line t(s) = alpha + s/B is fitted through the medians by least squares; the file
gets every sample, the medians and the fit, and `python -m testbed.run --calibration FILE`
predicts a real-network run's communication with the alpha and B of its strategy's path.

Where the peers land decides what is measured: first both on one node (`scope` says "same
node"); then, on a cluster of two nodes or more (`--address`), on two different nodes (the file's
`inter_node` section, its scope naming both nodes). Numbers are this machine's, under whatever else runs on it: a busy machine
measures slower paths, and says so (the machine-load line).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from testbed.config import ConfigError
from testbed.config.calibration import PATHS, calibration_doc, fit
from testbed.util.units import format_bytes

DEFAULT_SIZES = "4KiB,256KiB,4MiB"


def add_arguments(sub: Any) -> None:
    a = sub.add_parser("network", help="a real network's latency and bandwidth per message path "
                       "(a calibration file for --calibration)").add_argument
    a("--sizes", default=DEFAULT_SIZES, help="comma-separated message sizes, e.g. 4KiB,256KiB,4MiB")
    a("--paths", default=",".join(PATHS), help=f"comma-separated paths among {', '.join(PATHS)}")
    a("--repeats", type=int, default=20, help="timed messages per (path, size)")
    a("--warmup", type=int, default=5, help="untimed messages before them")
    a("--timeout", type=float, default=120.0, help="seconds any remote wait may take")
    a("--out", default=None, help="write the calibration file here (JSON)")
    a("--address", default=None, help="HOST:PORT of a running Ray cluster (default: a private local Ray); "
      "with two nodes or more the inter-node paths are measured too")


def validate(ns: argparse.Namespace, split: Any, parse_sizes: Any) -> None:
    """Check the network benchmark's options in place (ConfigError with the one-line fix);
    SPLIT and PARSE_SIZES are the benchmark CLI's list and size parsers."""
    sizes = parse_sizes(ns.sizes)
    if len(set(sizes)) < 2:
        raise ConfigError(f"--sizes {ns.sizes!r}: a line needs two sizes or more, e.g. {DEFAULT_SIZES}")
    paths = split("--paths", ns.paths)
    bad = [p for p in paths if p not in PATHS]
    if bad:
        raise ConfigError(f"--paths {bad[0]!r}: choose among {', '.join(PATHS)}")
    if ns.repeats < 3:
        raise ConfigError(f"--repeats {ns.repeats!r}: use 3 or more (a median and its spread), e.g. 20")
    if ns.warmup < 0:
        raise ConfigError(f"--warmup {ns.warmup!r}: use an integer >= 0, e.g. 5")
    if not (ns.timeout > 0 and np.isfinite(ns.timeout)):
        raise ConfigError(f"--timeout {ns.timeout!r}: use a finite number of seconds > 0, e.g. 120")
    check_memory(ns.sizes, sizes)
    ns.sizes, ns.paths = sorted(set(sizes)), list(dict.fromkeys(paths))


COPIES = 6  # of the largest message: each peer's outgoing and incoming one, a channel or object-store copy each way


def check_memory(given: str, sizes: list[int]) -> None:
    """Refuse, before Ray, a size the machine cannot hold COPIES times (a 1TiB message otherwise
    ends in a MemoryError inside a peer); the memory Ray would give its workers."""
    from testbed.runtime.cluster import local_machine

    s = max(sizes)
    need, have = s * COPIES, local_machine()["memory"]
    if need > have:
        raise ConfigError(f"--sizes {given!r}: two peers hold about {COPIES} copies of a message of "
                          f"{format_bytes(s)}, "
                          f"{need / 2**30:.1f} GiB, but the machine has {have / 2**30:.1f} GiB for them; "
                          f"use sizes up to {format_bytes(int(have // COPIES))}")


def run_network(ns: argparse.Namespace, prog: str) -> dict[str, Any]:
    """Measure every (path, size) between two actors on one node, and -- when the cluster has two
    nodes or more -- between two actors on different nodes; return the calibration file's content."""
    import ray

    from testbed.analysis.provenance import provenance
    from testbed.config import ClusterConfig
    from testbed.runtime.cluster import Cluster
    from testbed.runtime.rayprocs import start_ray, stop_ray
    from testbed.util.machine import busy_fraction

    probe = Cluster(ClusterConfig(timeout_s=ns.timeout, address=ns.address), workers=2, servers=1)
    probe.precheck_local()
    busy = busy_fraction(1.0)
    started = start_ray(probe.address())
    try:
        same, scope = _measure(ns, "pack")
        inter, inter_unfitted = None, {}
        if Cluster.alive_nodes() > 1:
            paths, where = _measure(ns, "spread")
            if where.startswith("across"):
                inter = ({k: v for k, v in paths.items() if "alpha_s" in v}, where)
                inter_unfitted = {k: v for k, v in paths.items() if "alpha_s" not in v}
    finally:
        if started and ray.is_initialized():
            stop_ray()
    doc = calibration_doc({k: v for k, v in same.items() if "alpha_s" in v}, scope, provenance(),
                          time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), inter_node=inter)
    doc.update(command=[prog, *ns.argv], busy_before=busy,
               unfitted={k: v for k, v in same.items() if "alpha_s" not in v})
    if inter_unfitted:
        doc["inter_node"]["unfitted"] = inter_unfitted
    return doc


def _measure(ns: argparse.Namespace, placement: str) -> tuple[dict[str, dict[str, Any]], str]:
    """Every (path, size) between two bench peers placed with `placement` (pack: one node where
    it fits, spread: two nodes where there are two); the paths and where the peers were."""
    from testbed.bench.lib import Runner
    from testbed.config import ClusterConfig
    from testbed.runtime.cluster import Cluster
    from testbed.runtime.remote import get

    cluster = Cluster(ClusterConfig(timeout_s=ns.timeout, address=ns.address, placement=placement),
                      workers=2, servers=1)
    paths: dict[str, dict[str, Any]] = {}
    with cluster:
        where = cluster.bundle_nodes()
        runner = Runner(cluster, 2, seed=0, timeout=ns.timeout)
        try:
            nodes = get([p.node_id.remote() for p in runner.peers], ns.timeout, "node ids")
            for path in ns.paths:
                samples = {size: runner.one_way(path, size, ns.repeats, ns.warmup) for size in ns.sizes}
                medians = [float(np.median(samples[s])) for s in ns.sizes]
                entry: dict[str, Any] = {
                    "sizes_bytes": ns.sizes, "one_way_s": medians,
                    "one_way_s_p10": [float(np.percentile(samples[s], 10)) for s in ns.sizes],
                    "one_way_s_p90": [float(np.percentile(samples[s], 90)) for s in ns.sizes],
                    "samples": {str(s): v for s, v in samples.items()}}
                try:
                    link = fit(ns.sizes, medians)
                    entry.update(alpha_s=link.alpha_s, bandwidth_Bps=link.bandwidth_Bps)
                except ValueError as exc:
                    entry["fit_error"] = str(exc)  # kept, and left out of --calibration's paths
                paths[path] = entry
        finally:
            runner.close()
    scope = ("same node" if nodes[0] == nodes[1] else
             f"across nodes {where.get(0, nodes[0][:8])} and {where.get(1, nodes[1][:8])}")
    return paths, scope


def report(doc: dict[str, Any]) -> str:
    busy = doc.get("busy_before")
    lines = [f"network between two actors ({doc['scope']})"
             + ("" if busy is None else f"; machine busy before: {busy:.0%}")]
    lines += _path_lines({**doc["paths"], **doc.get("unfitted", {})})
    if "inter_node" in doc:
        lines.append(f"network between two actors ({doc['inter_node']['scope']})")
        lines += _path_lines({**doc["inter_node"]["paths"], **doc["inter_node"].get("unfitted", {})})
    return "\n".join(lines)


def _path_lines(paths: dict[str, Any]) -> list[str]:
    lines = []
    for name, entry in paths.items():
        times = ", ".join(f"{format_bytes(s)} {t * 1e6:.0f} us" for s, t in
                          zip(entry["sizes_bytes"], entry["one_way_s"], strict=True))
        fitted = (f"alpha {entry['alpha_s'] * 1e6:.0f} us, bandwidth {entry['bandwidth_Bps'] / 1e9:.3g} GB/s"
                  if "alpha_s" in entry else f"no fit: {entry['fit_error']}")
        lines.append(f"  {name:8s} one-way {times} -> {fitted}")
    return lines
