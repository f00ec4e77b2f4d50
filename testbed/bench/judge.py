"""`python -m testbed.bench targets RUN.json ...`: the allreduce targets judged by the median of
several benchmark runs, with the ring's and gloo's numbers of every run beside them.

One run of `python -m testbed.bench allreduce --out RUN.json` is one sample, and on a small
machine a sample moves by several percent from one run to the next; a goal is met when the
median over the runs meets it. Each run judged its own targets (`report.targets`); this module
only collects them, so a target is judged here exactly as in the run that measured it.

    python -m testbed.bench allreduce --workers 4,8 --sizes 4KB,64MB --out run1.json   # x3
    python -m testbed.bench targets run1.json run2.json run3.json --markdown docs/measured/bench-allreduce.md

`--markdown FILE` also writes the report as a page (the repository keeps the reference
machine's in docs/measured/).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import numpy as np

from testbed.bench.report import hardware_line, load_line, meets
from testbed.config import ConfigError
from testbed.util.units import format_bytes, format_seconds

BESIDE = ("ring-objstore", "gloo")  # the methods shown beside the targets, per run


def add_arguments(sub: Any) -> None:
    a = sub.add_parser("targets", help="the allreduce targets judged by the median of several runs").add_argument
    a("runs", nargs="+", help="the --out files of 'python -m testbed.bench allreduce' runs")
    a("--markdown", default=None, help="also write the report as a markdown page to this file")


def validate(ns: argparse.Namespace, schema: str) -> None:
    """Load every run's document into ns.docs (ConfigError with the one-line fix)."""
    fix = "give the --out file of a 'python -m testbed.bench allreduce' run"
    docs = []
    for path in ns.runs:
        try:
            with open(path) as f:
                doc = json.load(f)
        except FileNotFoundError:
            raise ConfigError(f"targets {path!r}: no such file; {fix}") from None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"targets {path!r}: not readable as JSON ({exc}); {fix}") from None
        if not isinstance(doc, dict) or doc.get("schema") != schema or "targets" not in doc:
            raise ConfigError(f"targets {path!r}: not an allreduce benchmark document; {fix}")
        docs.append(doc)
    if ns.markdown is not None and not os.path.isdir(os.path.dirname(os.path.abspath(ns.markdown))):
        raise ConfigError(f"--markdown {ns.markdown!r}: give a file path in an existing folder, e.g. targets.md")
    ns.docs = docs


def judge(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target that every run measured: its values by run, their median, and whether the
    median meets the goal (by the rule the runs applied: value >= or <= bound)."""
    names = [t["name"] for t in docs[0]["targets"]]
    out = []
    for name in names:
        found = [next((t for t in d["targets"] if t["name"] == name), None) for d in docs]
        if any(t is None for t in found):
            continue
        values = [t["value"] for t in found]
        median = float(np.median(values))
        out.append({"name": name, "values": values, "median": median, "goal": found[0]["goal"],
                    "met": meets(median, found[0]["bound"], found[0]["above"]),
                    "runs_met": sum(t["met"] for t in found)})
    return out


def beside(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ring-objstore's and gloo's time and CPU in every run, for each (N, size) all runs measured."""
    keys = sorted({(r["workers"], r["size_bytes"]) for r in docs[0]["results"]})
    out = []
    for n, size in keys:
        for method in BESIDE:
            rows = [next((r for r in d["results"] if (r["workers"], r["size_bytes"], r["method"]) == (n, size, method)),
                         None) for d in docs]
            if any(r is None for r in rows):
                continue
            out.append({"workers": n, "size_bytes": size, "method": method,
                        "times_s": [r["median_s"] for r in rows], "cpus_s": [r["cpu_s_median"] for r in rows]})
    return out


def _without_out(command: list[str]) -> list[str]:
    """A run's command line without its --out (each run names its own file)."""
    out, skip = [], False
    for word in command:
        if skip:
            skip = False
        elif word == "--out":
            skip = True
        elif not word.startswith("--out="):
            out.append(word)
    return out


def _value(name: str, v: float) -> str:
    return f"{v:.2f} ms" if "(ms)" in name else f"{v:.3f}"


def markdown(docs: list[dict[str, Any]], judged: list[dict[str, Any]], paths: list[str]) -> str:
    k = len(docs)
    runs = " | ".join(f"run {i + 1}" for i in range(k))
    lines = [f"# Allreduce targets: median of {k} runs", "",
             f"Made by `python -m testbed.bench targets {' '.join(os.path.basename(p) for p in paths)}`; "
             f"each run by `{' '.join(_without_out(docs[0]['command']))} --out RUN.json` "
             "([performance.md](../performance.md)).", "",
             f"- {hardware_line(docs[0]['machine'])}"]
    lines += [f"- run {i + 1}: {load_line(d['machine']) or 'load not measured'}" for i, d in enumerate(docs)]
    lines += ["", f"| target | {runs} | median | goal | median meets it |",
              "|---|" + "---|" * k + "---|---|---|"]
    for t in judged:
        cells = " | ".join(_value(t["name"], v) for v in t["values"])
        lines.append(f"| {t['name']} | {cells} | {_value(t['name'], t['median'])} | {t['goal']} | "
                     f"{'met' if t['met'] else 'MISSED'} |")
    lines += ["", "The ring and gloo in the same runs (each run's median round; cpu summed over the processes):", "",
              f"| N | size | method | time: {runs} | cpu: {runs} |",
              "|---|---|---|" + "---|" * (2 * k)]
    for r in beside(docs):
        times = " | ".join(format_seconds(x) for x in r["times_s"])
        cpus = " | ".join(format_seconds(x) for x in r["cpus_s"])
        lines.append(f"| {r['workers']} | {format_bytes(r['size_bytes'])} | {r['method']} | {times} | {cpus} |")
    return "\n".join(lines) + "\n"


def report(judged: list[dict[str, Any]], k: int) -> str:
    lines = [f"targets, median of {k} runs:"]
    for t in judged:
        values = ", ".join(_value(t["name"], v) for v in t["values"])
        lines.append(f"target {t['name']}: {_value(t['name'], t['median'])} (runs: {values}; goal {t['goal']}): "
                     f"{'met' if t['met'] else 'MISSED'}")
    return "\n".join(lines)


def run(ns: argparse.Namespace) -> int:
    judged = judge(ns.docs)
    print(report(judged, len(ns.docs)))
    if ns.markdown:
        with open(ns.markdown, "w") as f:
            f.write(markdown(ns.docs, judged, ns.runs))
        print(f"wrote {ns.markdown}")
    return 0
