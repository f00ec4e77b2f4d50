"""The scaling-curve regression check: measured curves against a baseline and the cost model.

Pure (no Ray). `testbed.sweep --check` runs a spec afresh, then calls `check` and
`write_report`; the test suite calls the same two functions.

Each point (curve = strategy, N) gets one row:

    curve  N  baseline  measured  drift  band  late  model  off-model  verdict

- drift     = measured / baseline - 1, failing beyond the point's band (`baseline.band`,
              derived from the spread the baseline measured) plus `late`;
- late      = the share of emulated time whose messages arrived after their emulated delivery in
              this check's runs at N and at N0, added (`emulation_leak_frac`): a machine too busy
              to keep the emulator on time stretches both T(N) and T(N0) by at most that much. A
              point that drifts beyond its band but within `late` passes, and the report names it
              as what this machine could not resolve (beside a CPU hog the ring's T(8)/T(2) moved
              +6.1% against a 5% band, with 9.5% of its emulated time late at N = 8); a slowdown
              of the code that keeps messages on time (the injected latency of
              tests/ray/test_regression.py) is not covered by it and fails;
- off-model = measured / model - 1 (emulated curves only), failing beyond MODEL_TOLERANCE plus
              `late` (lateness moves a ratio off the model as it moves it off the baseline; a
              point within the sum but beyond the tolerance passes, named as unresolved);
- verdict   = "ok", "drift", "off model", "not measured" (the run failed, or N is gone)
              "not in baseline" (a new curve or N: refresh the baseline deliberately) or
              "no baseline value" (the baseline holds NaN or another unusable ratio there).

The report goes into the sweep folder: regression.json (every row, both provenances, the band
rule), regression.md (ready to paste into a pull-request comment) and regression.png/.svg
(per curve: the baseline with its band, the measurement, the cost model).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from testbed.analysis.baseline import MODEL_TOLERANCE, REFRESH, Curves, band, usable

VERDICTS = ("ok", "drift", "off model", "not measured", "not in baseline", "no baseline value")


@dataclass(frozen=True)
class Row:
    curve: str
    n: int
    n0: int
    baseline: float | None
    measured: float | None
    drift: float | None
    band: float
    model: float | None
    off_model: float | None
    model_tolerance: float
    verdict: str
    late: float = 0.0

    @property
    def failed(self) -> bool:
        return self.verdict != "ok"

    @property
    def unresolved(self) -> bool:
        """Passed only by the emulator's lateness: beyond the band (or the model's tolerance),
        within it plus late."""
        return self.verdict == "ok" and (self.drift is not None and abs(self.drift) > self.band
                                         or self.off_model is not None and abs(self.off_model) > self.model_tolerance)

    def message(self, refresh: str = REFRESH) -> str:
        """One line for a failing row: what moved, by how much, against what (REFRESH: the
        command that measures the baseline again)."""
        ratio = f"T({self.n})/T({self.n0})"
        if self.verdict == "not measured":
            return f"{self.curve}: no measured step time at N={self.n}; did its run fail?"
        if self.verdict == "not in baseline":
            return f"{self.curve}: N={self.n} is not in the baseline; refresh it: {refresh}"
        if self.verdict == "no baseline value":
            return (f"{self.curve}: the baseline's {ratio} is {self.baseline!r}, not a finite number > 0, "
                    f"so N={self.n} cannot be compared; refresh it: {refresh}")
        if self.verdict == "drift":
            late = f" + {self.late:.1%} late" if self.late else ""
            return (f"{self.curve}: {ratio} is {self.measured:.2f}, baseline {self.baseline:.2f} "
                    f"({self.drift:+.1%}, band {self.band:.1%}{late})")
        if self.unresolved and self.drift is not None and abs(self.drift) > self.band:
            return (f"{self.curve}: {ratio} is {self.measured:.2f}, baseline {self.baseline:.2f} "
                    f"({self.drift:+.1%}): beyond the band {self.band:.1%} but within the {self.late:.1%} "
                    "of emulated time that arrived late, so this machine could not resolve it; rerun "
                    "on an idle machine or at a higher --dilation")
        if self.unresolved:
            return (f"{self.curve}: {ratio} is {self.measured:.2f}, cost model {self.model:.2f} "
                    f"({self.off_model:+.1%}): beyond the tolerance {self.model_tolerance:.0%} but within "
                    f"the {self.late:.1%} of emulated time that arrived late, so this machine could not "
                    "resolve it; rerun on an idle machine or at a higher --dilation")
        return (f"{self.curve}: {ratio} is {self.measured:.2f}, cost model {self.model:.2f} "
                f"({self.off_model:+.1%}, tolerance {self.model_tolerance:.0%})")


def check(measured: Curves, data: Mapping[str, Any], late: Curves | None = None) -> list[Row]:
    """One row per (curve, N) in the measurement or the baseline DATA (`load_baseline`); `late`:
    per curve and N, the share of emulated time the measurement's runs received late
    (`baseline.curve_late`), added to the band of T(N)/T(N0) for N and N0."""
    late = late or {}
    rows = []
    base, bands, model = data["ratios"], data.get("band", {}), data.get("model_ratios", {})
    for curve in sorted(set(measured) | set(base)):
        got, ref, mod = measured.get(curve, {}), base.get(curve, {}), model.get(curve, {})
        ns = sorted({int(n) for n in got} | {int(n) for n in ref})
        n0 = min(int(n) for n in ref) if ref else min(ns)
        for n in ns:
            key = str(n)
            g, r, m = got.get(key), ref.get(key), mod.get(key)
            kept = r is not None and usable(r)
            drift = g / r - 1 if g is not None and kept else None
            off = None if g is None or m is None else g / m - 1
            b = bands.get(curve, {}).get(key)
            b = band(None) if b is None else float(b)
            lag = late.get(curve, {})
            extra = 0.0 if n == n0 else max(0.0, lag.get(key, 0.0)) + max(0.0, lag.get(str(n0), 0.0))
            if g is None:
                verdict = "not measured"
            elif r is None:
                verdict = "not in baseline"
            elif not kept:
                verdict = "no baseline value"
            elif abs(drift) > b + extra:
                verdict = "drift"
            elif off is not None and abs(off) > MODEL_TOLERANCE + extra:
                verdict = "off model"
            else:
                verdict = "ok"
            shown = r if r is None or isinstance(r, (int, float)) and not isinstance(r, bool) else None
            rows.append(Row(curve, n, n0, shown, g, drift, b, m, off, MODEL_TOLERANCE, verdict, extra))
    return rows


def passed(rows: list[Row]) -> bool:
    return bool(rows) and not any(r.failed for r in rows)


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


HEADER = ("curve", "N", "baseline", "measured", "drift", "band", "late", "model", "off model", "verdict")


def _cells(r: Row) -> tuple[str, ...]:
    return (r.curve, str(r.n), _num(r.baseline, ".3f"), _num(r.measured, ".3f"), _num(r.drift, "+.1%"),
            _num(r.band, ".1%"), _num(r.late, ".1%"), _num(r.model, ".3f"), _num(r.off_model, "+.1%"),
            r.verdict + (" (unresolved)" if r.unresolved else ""))


def text_table(rows: list[Row]) -> str:
    """The rows as aligned text, for a terminal."""
    cells = [HEADER] + [_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in cells)


def markdown(rows: list[Row], data: Mapping[str, Any], context: Mapping[str, Any]) -> str:
    """A pull-request comment: verdict, what failed, the table, where both measurements come from."""
    ok = passed(rows)
    prov, here = data.get("provenance", {}), context.get("provenance", {})
    lines = [f"### Scaling-curve regression: {'PASS' if ok else 'FAIL'} ({context.get('spec_name', '?')})", ""]
    noted = [r for r in rows if r.failed or r.unresolved]
    lines += [f"- {r.message(context.get('refresh', REFRESH))}" for r in noted] + ([""] if noted else [])
    lines += ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    tol = data.get("tolerance", {})
    lines += ["", f"Ratios T(N)/T(N0) of each run's shortest step interval (`{data.get('metric')}`). "
              f"Band per point: {tol.get('rule', '?')} (floor {tol.get('floor', '?')}, factor "
              f"{tol.get('factor', '?')}, from {data.get('repeats', '?')} repeats), plus `late`: the "
              "share of emulated time this run's messages at N and N0 received after their emulated "
              f"delivery. Cost model: within {MODEL_TOLERANCE:.0%} plus `late`, emulated curves only.", "",
              f"- baseline: `{context.get('baseline_path', '?')}`, {data.get('mode')} network, measured "
              f"{data.get('created')} at commit `{str(prov.get('git_commit'))[:12]}`"
              f"{' (uncommitted changes)' if prov.get('git_dirty') else ''} on {_machine(prov)}",
              f"- this run: commit `{str(here.get('git_commit'))[:12]}`"
              f"{' (uncommitted changes)' if here.get('git_dirty') else ''} on {_machine(here)}",
              "", "![baseline vs measured](regression.png)", ""]
    return "\n".join(lines)


def _machine(p: Mapping[str, Any]) -> str:
    return (f"{p.get('cpu_count')} x {p.get('cpu_model') or 'unknown CPU'}, {p.get('memory_gib')} GiB, "
            f"Python {p.get('python')}, Ray {p.get('ray')}, torch {p.get('torch')}")


def figure(rows: list[Row], stem: str | os.PathLike) -> list[Path]:
    """Per curve: baseline ratio with its band, measured ratio, model ratio; STEM.png and .svg."""
    from testbed.analysis.figures import colors, new_figure, save

    curves = sorted({r.curve for r in rows})
    fig, axes = new_figure(ncols=max(1, len(curves)), width=4.2, height=3.6)
    for ax, curve, color in zip(axes, curves, colors(len(curves)), strict=False):
        mine = [r for r in rows if r.curve == curve]
        based = [r for r in mine if r.baseline is not None and usable(r.baseline)]
        if based:
            ns = [r.n for r in based]
            ax.plot(ns, [r.baseline for r in based], "-", color=color, label="baseline")
            ax.fill_between(ns, [r.baseline * (1 - r.band) for r in based],
                            [r.baseline * (1 + r.band) for r in based], color=color, alpha=0.2,
                            label="band")
        modelled = [r for r in mine if r.model is not None]
        if modelled:
            ax.plot([r.n for r in modelled], [r.model for r in modelled], ":", color="grey",
                    label="cost model")
        for r in mine:
            if r.measured is not None:
                ax.plot([r.n], [r.measured], "o" if not r.failed else "X", color=color if not r.failed
                        else "red", markersize=7 if not r.failed else 10)
        ax.plot([], [], "o", color=color, label="measured")
        ax.set_title(f"{curve}: {'FAIL' if any(r.failed for r in mine) else 'ok'}")
        ax.set_xlabel("workers N")
        ax.set_ylabel(f"T(N) / T({mine[0].n0})")
        ax.set_xticks(sorted({r.n for r in mine}))
        ax.legend(fontsize=8)
    return save(fig, stem)


def write_report(folder: str | os.PathLike, rows: list[Row], data: Mapping[str, Any],
                 context: Mapping[str, Any]) -> dict[str, Any]:
    """regression.json, regression.md and regression.png/.svg into FOLDER; returns the JSON."""
    from testbed.analysis.results import write_json, write_text

    out = Path(folder)
    fix = context.get("refresh", REFRESH)
    report = {"passed": passed(rows), "failures": [r.message(fix) for r in rows if r.failed],
              "rows": [asdict(r) for r in rows], **dict(context),
              "baseline": {k: data.get(k) for k in ("created", "mode", "repeats", "tolerance",
                                                     "spec_identity", "provenance")}}
    write_json(out / "regression.json", report)
    write_text(out / "regression.md", markdown(rows, data, context))
    if rows:
        figure(rows, out / "regression")
    return report
