"""Run folders: atomic writes, schema versions, never overwritten, and reading them back.

    results/runs/<run_id>/
      config.json      resolved config + provenance (git commit, dirty flag, versions, machine)
      steps.parquet    one row per worker iteration         (strategy.StepRecord)
      updates.parquet  one row per model update             (strategy.UpdateRecord)
      events.parquet   timeline spans                       (strategy.Event)
      summary.json     derived statistics + status (completed / interrupted / failed)
      params.npz       final parameters, flat float arrays keyed by parameter name
      timeline.json    optional Chrome trace (opens in Perfetto)

    results/sweeps/<name>/runs.parquet   one row per run of a sweep (write_sweep_table,
                                         load_table; run_tables reads its runs' tables)

Each file is written to a temporary name in the same folder and renamed into place, so a crash
mid-write leaves the previous complete version, never a torn file. No pickle anywhere.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from testbed.strategy import EVENT_COLUMNS, STEP_COLUMNS, UPDATE_COLUMNS, Recorder

SCHEMA_VERSION = 1
TABLES = {"steps": STEP_COLUMNS, "updates": UPDATE_COLUMNS, "events": EVENT_COLUMNS}
# Summary keys that repeat a sweep table's config column, or would be ambiguous beside one.
SUMMARY_RENAMES = {"steps": "steps_applied", "status": "run_status"}
SUMMARY_DROPPED = ("strategy", "workers", "workload", "schema_version")


def new_run_id(strategy: str, workers: int) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{strategy}-n{workers}-{secrets.token_hex(2)}"


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed write leaves the previous version and no litter
        raise


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    def w(tmp: Path) -> None:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=_jsonable) + "\n")

    _atomic_write(path, w)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def write_table(path: Path, rows: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    frame = pd.DataFrame(rows, columns=list(columns))
    meta = {b"testbed_schema_version": str(SCHEMA_VERSION).encode()}

    def w(tmp: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pandas(frame, preserve_index=False)
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
        pq.write_table(table, tmp)

    _atomic_write(path, w)


def provenance() -> dict[str, Any]:
    """Git commit + dirty flag, package versions and the machine, for config.json."""
    info: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(),
                            "cpu_count": os.cpu_count()}
    for mod in ("ray", "torch", "numpy", "pandas"):
        try:
            info[mod] = __import__(mod).__version__
        except ImportError:
            info[mod] = None
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    info["git_commit"] = git("rev-parse", "HEAD")
    # --no-optional-locks: never take index.lock, so a run cannot break the user's git command.
    status = git("--no-optional-locks", "status", "--porcelain", "--untracked-files=no")
    info["git_dirty"] = None if status is None else bool(status)
    return info


class RunFolder:
    """One run's folder. Created fresh (never reused); every write is atomic."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, out: str | os.PathLike, run_id: str) -> RunFolder:
        root = Path(out)
        root.mkdir(parents=True, exist_ok=True)
        path = root / run_id
        path.mkdir(parents=False, exist_ok=False)  # never overwrite a run
        return cls(path)

    def write_config(self, config: dict[str, Any], machine: dict[str, Any] | None = None) -> None:
        data = {"schema_version": SCHEMA_VERSION, "config": config, "provenance": provenance()}
        if machine:
            data["machine"] = machine
        write_json(self.path / "config.json", data)

    def write_records(self, recorder: Recorder) -> None:
        """Persist everything recorded so far (used as the recorder's sink)."""
        write_table(self.path / "steps.parquet", list(recorder.steps), STEP_COLUMNS)
        write_table(self.path / "updates.parquet", list(recorder.updates), UPDATE_COLUMNS)
        write_table(self.path / "events.parquet", list(recorder.events), EVENT_COLUMNS)

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json(self.path / "summary.json", {"schema_version": SCHEMA_VERSION, **summary})

    def write_params(self, params: Mapping[str, np.ndarray]) -> None:
        def w(tmp: Path) -> None:
            with open(tmp, "wb") as fh:
                np.savez(fh, **{k: np.asarray(v) for k, v in params.items()})

        _atomic_write(self.path / "params.npz", w)

    def write_timeline(self, trace: dict[str, Any]) -> None:
        write_json(self.path / "timeline.json", trace)


# ---------------------------------------------------------------- reading


def load_run(path: str | os.PathLike) -> dict[str, Any]:
    """Read a run folder back: config, summary, tables (DataFrames) and params."""
    p = Path(path)
    out: dict[str, Any] = {
        "config": json.loads((p / "config.json").read_text()),
        "summary": json.loads((p / "summary.json").read_text()) if (p / "summary.json").exists() else None,
    }
    for name in TABLES:
        f = p / f"{name}.parquet"
        out[name] = pd.read_parquet(f) if f.exists() else pd.DataFrame(columns=list(TABLES[name]))
    if (p / "params.npz").exists():
        with np.load(p / "params.npz", allow_pickle=False) as npz:
            out["params"] = {k: npz[k] for k in npz.files}
    return out


def chrome_trace(events: list[dict[str, Any]], t0: float) -> dict[str, Any]:
    """Chrome trace (Perfetto-readable): one track (tid) per actor, spans in microseconds."""
    actors = sorted({e["actor"] for e in events}, key=_actor_order)
    tid = {a: i + 1 for i, a in enumerate(actors)}
    trace = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid[a], "args": {"name": a}}
             for a in actors]
    for e in events:
        trace.append({"name": e["phase"], "cat": e["phase"], "ph": "X", "pid": 1, "tid": tid[e["actor"]],
                      "ts": (e["t0"] - t0) * 1e6, "dur": max(0.0, (e["t1"] - e["t0"]) * 1e6)})
    return {"traceEvents": trace, "displayTimeUnit": "ms"}


def _actor_order(name: str) -> tuple[str, int]:
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return head, int(tail) if tail else -1


# ---------------------------------------------------------------- sweep tables


def summary_columns(summary: Mapping[str, Any]) -> dict[str, Any]:
    """summary.json -> runs.parquet columns: renamed where they would clash, dicts/lists as JSON."""
    out = {}
    for key, value in summary.items():
        if key in SUMMARY_DROPPED:
            continue
        if isinstance(value, (dict, list)):
            value = json.dumps(value, sort_keys=True)  # keep it, as text, in a scalar column
        out[SUMMARY_RENAMES.get(key, key)] = value
    return out


def arrow_safe(df: pd.DataFrame) -> pd.DataFrame:
    """JSON-encode object columns that mix types (parquet needs one type per column)."""
    for col in [c for c in df.columns if pd.api.types.is_object_dtype(df[c])]:
        kinds = {type(v).__name__ for v in df[col] if v is not None and v == v}
        if len(kinds - {"int", "float"}) > 1 or (kinds & {"int", "float"} and kinds - {"int", "float"}):
            df[col] = [None if v is None or v != v else json.dumps(v, default=str) for v in df[col]]
    return df


def write_sweep_table(df: pd.DataFrame, path: Path, sweep: Mapping[str, Any]) -> None:
    """Write a sweep's runs.parquet atomically; SWEEP ({name, grid, repeats}) goes in its metadata."""
    meta = {b"testbed_schema_version": str(SCHEMA_VERSION).encode(),
            b"testbed_sweep": json.dumps(dict(sweep)).encode()}

    def w(tmp: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pandas(df, preserve_index=False)
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
        pq.write_table(table, tmp)

    _atomic_write(path, w)


def load_table(sweep_dir: str | os.PathLike) -> pd.DataFrame:
    """Read a sweep's runs.parquet; run_dir becomes absolute; df.attrs["sweep"] has the grid."""
    import pyarrow.parquet as pq

    path = Path(sweep_dir)
    path = path if path.suffix == ".parquet" else path / "runs.parquet"
    table = pq.read_table(path)
    df = table.to_pandas()
    if "run_dir" in df.columns:
        df["run_dir"] = [None if pd.isna(d) else str(path.parent / d) for d in df["run_dir"]]
    meta = (table.schema.metadata or {}).get(b"testbed_sweep")
    df.attrs["sweep"] = json.loads(meta) if meta else {}
    return df


def run_tables(table: pd.DataFrame, kind: str, *, repeat: int = 0) -> dict[str, pd.DataFrame]:
    """{series label: steps or updates table} for the completed runs of one repeat."""
    from testbed.analysis.plots import series_labels

    rows = table[(table["status"] == "completed") & (table["repeat"] == repeat)]
    labels = series_labels(rows, exclude=())
    return {labels[i]: pd.read_parquet(Path(rows.at[i, "run_dir"]) / f"{kind}.parquet")
            for i in rows.index if (Path(rows.at[i, "run_dir"]) / f"{kind}.parquet").exists()}
