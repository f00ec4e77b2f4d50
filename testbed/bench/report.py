"""The allreduce benchmark's report: rows derived from the raw samples, the table, the latency
lines and the targets (`cli.py` measures; this module derives and judges).

Targets, each checked where the run measured its (N, size) and printed `met` or `MISSED`:

1. busbw: the object-store ring at N = 4, 64 MB reaches at least gloo's busbw;
2. latency: the ring at N = 8, 4 KB takes at most 1.5x its 2(N-1) one-hop pings;
3. cpu: one ring at N = 8, 4 KB costs at most 7 ms of CPU, summed over its 8 processes (the
   price of a hop, which buys emulated fidelity at scale);
4. time: the ring at 64 MB takes at most 0.6x gloo's time, at N = 4 and at N = 8.

Targets 3 and 4 are this 2-core reference machine's; elsewhere they are a yardstick, not a
rule. One run is one sample: judge a target by the median of several runs.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from testbed.util.machine import busy
from testbed.util.units import format_bytes, format_seconds

TARGET_BUSBW_N, TARGET_BUSBW_MIN_SIZE = 4, 64 * 10**6  # (1) ring >= 1.0x gloo busbw
TARGET_LAT_N, TARGET_LAT_RATIO = 8, 1.5  # (2) ring <= 1.5 x 2(N-1) hops
TARGET_CPU_N, TARGET_CPU_SIZE, TARGET_CPU_S = 8, 4 * 10**3, 7e-3  # (3) ring cpu per round
TARGET_TIME_NS, TARGET_TIME_SIZE, TARGET_TIME_RATIO = (4, 8), 64 * 10**6, 0.6  # (4) ring time / gloo's


def latency_entry(n: int, hops: list[float], rows: list[dict[str, Any]],
                  method: str = "ring-objstore", loaded: bool = False) -> dict[str, Any]:
    """`method`'s time at its smallest size against 2(N-1) one-hop pings over the same path,
    pinged by one pair of ranks (idle) or by every pair at once (loaded)."""
    hop = float(np.median(hops))
    small = min((r for r in rows if r["workers"] == n and r["method"] == method),
                key=lambda r: r["size_bytes"])
    bound = 2 * (n - 1) * hop
    return {"workers": n, "method": method, "hop_load": "loaded" if loaded else "idle",
            "hop_samples_s": hops, "hop_s": hop,
            "ring_size_bytes": small["size_bytes"], "ring_s": small["median_s"], "hops_s": bound,
            "ratio": small["median_s"] / bound,
            "cpu_floor_s": small["cpu_s_median"] / (os.cpu_count() or 1)}


def format_latency(lat: dict[str, Any]) -> str:
    n = lat["workers"]
    return (f"latency N={n}: {lat['method']} {format_bytes(lat['ring_size_bytes'])} "
            f"{format_seconds(lat['ring_s'])} vs 2(N-1)={2 * (n - 1)} one-hop 4 KiB pings on its path, "
            f"{lat['hop_load']} ({format_seconds(lat['hop_s'])} each) = {format_seconds(lat['hops_s'])}: "
            f"{lat['ratio']:.2f}x (its CPU alone needs >= {format_seconds(lat['cpu_floor_s'])} on these cores)")


def meets(value: float, bound: float, above: bool) -> bool:
    """A target's rule: value >= bound (`above`) or value <= bound."""
    return value >= bound if above else value <= bound


def _target(name: str, value: float, bound: float, above: bool) -> dict[str, Any]:
    return {"name": name, "value": value, "bound": bound, "above": above,
            "goal": f"{'>=' if above else '<='} {bound:g}", "met": meets(value, bound, above)}


def targets(rows: list[dict[str, Any]], lats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ring's targets, each where this run measured its (N, size)."""
    out = []
    big = [r for r in rows if r["workers"] == TARGET_BUSBW_N and r["size_bytes"] >= TARGET_BUSBW_MIN_SIZE]
    if big:
        size = min(r["size_bytes"] for r in big)
        by = {r["method"]: r for r in big if r["size_bytes"] == size}
        out.append(_target(f"busbw ring-objstore / gloo, N={TARGET_BUSBW_N}, {format_bytes(size)}",
                           by["ring-objstore"]["busbw_Bps"] / by["gloo"]["busbw_Bps"], 1.0, True))
    for lat in lats:
        if lat["workers"] == TARGET_LAT_N and lat["method"] == "ring-objstore" and lat["hop_load"] == "idle":
            out.append(_target(f"ring latency / 2(N-1) hops, N={TARGET_LAT_N}, "
                               f"{format_bytes(lat['ring_size_bytes'])}", lat["ratio"], TARGET_LAT_RATIO, False))
    by = {(r["workers"], r["size_bytes"], r["method"]): r for r in rows}
    if (TARGET_CPU_N, TARGET_CPU_SIZE, "ring-objstore") in by:
        cpu = by[(TARGET_CPU_N, TARGET_CPU_SIZE, "ring-objstore")]["cpu_s_median"]
        out.append(_target(f"ring-objstore cpu (ms), N={TARGET_CPU_N}, {format_bytes(TARGET_CPU_SIZE)}",
                           cpu * 1e3, TARGET_CPU_S * 1e3, False))
    for n in TARGET_TIME_NS:
        ring, gloo = by.get((n, TARGET_TIME_SIZE, "ring-objstore")), by.get((n, TARGET_TIME_SIZE, "gloo"))
        if ring and gloo:
            out.append(_target(f"time ring-objstore / gloo, N={n}, {format_bytes(TARGET_TIME_SIZE)}",
                               ring["median_s"] / gloo["median_s"], TARGET_TIME_RATIO, False))
    return out


def hardware_line(m: dict[str, Any]) -> str:
    return (f"machine: {m['cpus']} CPUs, {m['memory_bytes'] / 2**30:.0f} GiB, {m['platform']}; "
            f"python {m['python']}, numpy {m['numpy']}, torch {m['torch']}, ray {m['ray']}")


def load_line(m: dict[str, Any]) -> str | None:
    """How busy the machine was around the run; None where it was not measured."""
    before, other = m.get("busy_before"), m.get("other_cpu_share")
    if before is None or other is None:
        return None
    line = (f"{before:.0%} of the CPUs busy before the run; processes other than the benchmark's "
            f"(Ray daemons included) used {other:.0%} of them during it")
    if busy(max(before, other)):
        line += " -- BUSY machine: numbers include foreign contention; rerun when quiet"
    return line


def machine_line(m: dict[str, Any]) -> str:
    load = load_line(m)
    return hardware_line(m) + ("" if load is None else f"\nmachine load: {load}")


def derive(n: int, size: int, method: str, m: dict[str, Any]) -> dict[str, Any]:
    """Raw samples -> median/p10/p90 time, algbw, busbw."""
    s = np.asarray(m["samples_s"], dtype=float)
    med = float(np.median(s))
    algbw = size / med
    return {"workers": n, "size_bytes": size, "method": method, "median_s": med,
            "p10_s": float(np.percentile(s, 10)), "p90_s": float(np.percentile(s, 90)),
            "algbw_Bps": algbw, "busbw_Bps": algbw * 2 * (n - 1) / n,
            "cpu_s_median": float(np.median(m["cpu_s"])), **m}


def _bw(x: float) -> str:
    return format_bytes(x) + "/s"


def format_table(rows: list[dict[str, Any]]) -> str:
    head = ("N", "size", "method", "time", "p10", "p90", "algbw", "busbw", "vs gloo", "cpu")
    lines = [head]
    for r in rows:
        ratio = r.get("ratio_to_gloo")
        lines.append((str(r["workers"]), format_bytes(r["size_bytes"]), r["method"],
                      format_seconds(r["median_s"]), format_seconds(r["p10_s"]),
                      format_seconds(r["p90_s"]), _bw(r["algbw_Bps"]), _bw(r["busbw_Bps"]),
                      "-" if ratio is None else f"{ratio:.2f}x", format_seconds(r["cpu_s_median"])))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    left = {2}
    out = []
    for line in lines:
        out.append("  ".join(c.ljust(w) if i in left else c.rjust(w)
                             for i, (c, w) in enumerate(zip(line, widths, strict=True))))
    return "\n".join(out)


def report(doc: dict[str, Any]) -> str:
    lines = [machine_line(doc["machine"])]
    if doc["machine"].get("gpu"):
        lines.append(f"buffers on the GPU: {doc['machine']['gpu']}, shared by every worker")
    lines += ["", format_table(doc["results"]), ""]
    lines += [f"left out: {m}: {why}" for m, why in doc.get("left_out", {}).items()]
    lines += [format_latency(lat) for lat in doc["latency"]]
    for t in doc["targets"]:
        lines.append(f"target {t['name']}: {t['value']:.2f} (goal {t['goal']}): "
                     f"{'met' if t['met'] else 'MISSED'}")
    return "\n".join(lines)
