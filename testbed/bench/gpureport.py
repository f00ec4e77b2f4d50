"""The GPU check's report (`python -m testbed.bench gpu`, testbed/bench/gpu.py): gpu.json's
stages as markdown, gpu.md."""

from __future__ import annotations

from typing import Any


def _pct(x: Any) -> str:
    return "-" if x is None else f"{x:.0%}"


def _num(x: Any, fmt: str = ".0f") -> str:
    return "-" if x is None else format(x, fmt)


def report(doc: dict[str, Any]) -> str:
    from testbed.util.units import format_bytes, format_seconds

    lines = ["# GPU check", ""]
    for stage, e in doc["stages"].items():
        lines.append(f"- {stage}: {e['status']}" + (f" ({e['reason']})" if e.get("reason") else "")
                     + f", {e.get('wall_s', 0):.0f} s")
    st = doc["stages"]
    facts = st.get("machine", {}).get("facts")
    if facts:
        lines += ["", f"machine: {facts['cpus']} CPUs, {facts['memory_bytes'] / 2**30:.0f} GiB; "
                      f"GPU {facts.get('gpu', 'none')}" + (f" x{facts['gpus']}, CUDA {facts['cuda']}, "
                                                           f"NCCL {facts['nccl']}" if facts.get("gpu") else "")
                  + f"; torch {facts['torch']}, ray {facts['ray']}, python {facts['python']}"]
    t = st.get("tests", {}).get("tests")
    if t:
        lines += ["", f"tests: {t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped"]
        lines += [f"  FAILED {x}" for x in t["failures"]] + [f"  skipped {x}" for x in t["skips"]]
    for stage, title in (("matrix", "2 workers on one GPU (mlp)"), ("runs", "8 workers, resnet")):
        rows = st.get(stage, {}).get("rows")
        if rows:
            lines += ["", f"{title}:", "", "| case | exit | device | GPU/worker | samples/s | step p50 | "
                      "compute / comm / wait | reason |", "|---|---|---|---|---|---|---|---|"]
            for r in rows:
                lines.append(f"| {r['case']} | {r['exit_code']} | {r.get('device') or '-'} | "
                             f"{_num(r.get('gpus_per_worker'), '.2f')} | {_num(r.get('samples_per_s'))} | "
                             f"{format_seconds(r['step_time_p50_s']) if r.get('step_time_p50_s') else '-'} | "
                             f"{_pct(r.get('compute_frac'))} / {_pct(r.get('comm_frac'))} / {_pct(r.get('wait_frac'))} | "
                             f"{r.get('line') or ''} |")
    for stage in ("bench-cuda", "bench-cpu"):
        rows = st.get(stage, {}).get("rows")
        if rows:
            lines += ["", f"{stage} (allreduce; vs gloo in the same run):", "",
                      "| N | size | method | time | busbw | vs gloo | cpu |", "|---|---|---|---|---|---|---|"]
            for r in rows:
                ratio = r.get("ratio_to_gloo")
                lines.append(f"| {r['workers']} | {format_bytes(r['size_bytes'])} | {r['method']} | "
                             f"{format_seconds(r['median_s'])} | {format_bytes(r['busbw_Bps'])}/s | "
                             f"{'-' if ratio is None else f'{ratio:.2f}x'} | {format_seconds(r['cpu_s_median'])} |")
            lines += [f"left out: {m}: {why}" for m, why in st[stage].get("left_out", {}).items()]
    return "\n".join(lines)
