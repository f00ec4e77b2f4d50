"""Run folders: atomic writes, schema versions, never overwritten, and reading them back.

    results/runs/<run_id>/
      config.json      resolved config + provenance (git commit, dirty flag, versions, machine)
      records.jsonl    every raw record, one JSON line each, appended the moment it arrives
      steps.parquet    one row per worker iteration         (records.StepRecord)
      updates.parquet  one row per model update             (records.UpdateRecord)
      events.parquet   timeline spans                       (records.Event)
      evals.parquet    held-out evaluations of the authoritative model, one row per version
                       evaluated, on the run's clock (records.EvalRecord, analysis.evals)
      summary.json     derived statistics + status (completed / interrupted / failed)
      params.npz       final parameters, flat float arrays keyed by parameter name
      timeline.json    optional Chrome trace (opens in Perfetto)

    results/sweeps/<name>/runs.parquet   one row per run of a sweep (write_sweep_table,
                                         load_table; plots.run_tables reads its runs' tables)

records.jsonl is the crash-consistent copy: a run killed at any moment keeps every record up
to the last complete line, and `load_run` turns such a folder into tables (status "crashed").
The parquet tables and summary are derived from the same records when the run ends. Every
other file is written to a temporary name in the same folder and renamed into place, so a
crash mid-write leaves the previous complete version, never a torn file. No pickle anywhere.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from testbed.analysis.provenance import provenance
from testbed.analysis.records import (
    EVAL_COLUMNS,
    EVENT_COLUMNS,
    STEP_COLUMNS,
    UPDATE_COLUMNS,
    Recorder,
)

SCHEMA_VERSION = 1
TABLES = {"steps": STEP_COLUMNS, "updates": UPDATE_COLUMNS, "events": EVENT_COLUMNS}
# Summary keys that repeat a sweep table's config column, or would be ambiguous beside one.
SUMMARY_RENAMES = {"steps": "steps_applied", "status": "run_status"}
SUMMARY_DROPPED = ("strategy", "workers", "workload", "schema_version")


def new_run_id(strategy: str, workers: int) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{strategy}-n{workers}-{secrets.token_hex(2)}"


class OutputError(OSError):
    """A run's file could not be written (disk full, read-only); the message is one line."""


def _output_error(path: Path, exc: OSError) -> OutputError:
    return OutputError(f"cannot write {path} ({exc.strerror or exc}); free space there or pick another --out")


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            tmp.unlink(missing_ok=True)  # a failed write leaves the previous version and no litter
        except OSError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, OutputError):
            raise _output_error(path, exc) from None
        raise


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    def w(tmp: Path) -> None:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=_jsonable) + "\n")

    _atomic_write(path, w)


def write_text(path: Path, text: str) -> None:
    _atomic_write(path, lambda tmp: tmp.write_text(text))


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def _arrow_schema(columns: tuple[str, ...]):
    """Column types of a record table; integers stay integers, None is null (never a sentinel)."""
    import pyarrow as pa

    from testbed.analysis.records import EvalRecord, Event, StepRecord, UpdateRecord

    hints = {**StepRecord.__annotations__, **UpdateRecord.__annotations__, **Event.__annotations__,
             **EvalRecord.__annotations__}
    kinds = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "bool": pa.bool_()}
    return pa.schema([(c, kinds[str(hints[c]).split("|")[0].strip()]) for c in columns])


def write_table(path: Path, rows: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    meta = {b"testbed_schema_version": str(SCHEMA_VERSION).encode()}

    def w(tmp: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows], schema=_arrow_schema(columns))
        table = table.replace_schema_metadata(meta)
        pq.write_table(table, tmp)

    _atomic_write(path, w)


def table_frame(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> pd.DataFrame:
    """Records -> the DataFrame their parquet table reads back as (same types, nulls as NaN)."""
    import pyarrow as pa

    table = pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows], schema=_arrow_schema(columns))
    return table.to_pandas()


class RecordLog:
    """records.jsonl: one JSON line per record, written (line-buffered) the moment it arrives.

    The Recorder's sink: `log(kind, row)` with kind step / update / event / fault / rollback.
    A process killed at any moment leaves every complete line readable (`read_log`).
    """

    NAME = "records.jsonl"

    def __init__(self, folder: Path) -> None:
        self.path = folder / self.NAME
        self.failed: OutputError | None = None
        try:
            self._fh = open(self.path, "a", buffering=1, encoding="utf-8")
        except OSError as exc:
            raise _output_error(self.path, exc) from None

    def __call__(self, kind: str, row: Mapping[str, Any]) -> None:
        if self.failed is not None:
            raise self.failed
        try:
            self._fh.write(json.dumps({"kind": kind, **row}, default=_jsonable) + "\n")
        except OSError as exc:  # disk full, read-only: the run stops, what was written stays readable
            self.failed = _output_error(self.path, exc)
            raise self.failed from None

    def close(self) -> None:
        try:
            if not self._fh.closed:
                self._fh.close()
        except OSError:  # the last buffered line could not be flushed; earlier lines are on disk
            pass


def read_log(path: str | os.PathLike) -> dict[str, list[dict[str, Any]]]:
    """records.jsonl -> {"steps", "updates", "events", "faults"}; a torn last line is skipped and
    rolled-back updates are left out, as the finished run's tables leave them out."""
    out: dict[str, list[dict[str, Any]]] = {"steps": [], "updates": [], "events": [], "faults": [], "evals": []}
    plural = {"step": "steps", "update": "updates", "event": "events", "fault": "faults", "eval": "evals"}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # the line a crash cut short
            kind = row.pop("kind", None)
            if kind == "rollback":
                out["updates"] = [u for u in out["updates"] if u["version"] <= row["version"]]
                out["evals"] = [e for e in out["evals"] if e["version"] <= row["version"]]
            elif kind in plural:
                out[plural[kind]].append(row)
    return out


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

    RESERVE = ".reserve"
    RESERVE_BYTES = (32 * 1024, 8 * 1024, 4 * 1024)  # room kept back for summary.json (the most that fits)

    def record_log(self) -> RecordLog:
        """The append-only log every record goes to as it arrives (the Recorder's sink); first a
        little space is set aside (`release_reserve`) so that a full disk still gets a summary."""
        for size in self.RESERVE_BYTES:
            try:
                (self.path / self.RESERVE).write_bytes(b"\0" * size)
                break
            except OSError:  # too little room: try less (the summary may then not fit)
                (self.path / self.RESERVE).unlink(missing_ok=True)
        return RecordLog(self.path)

    def release_reserve(self) -> None:
        (self.path / self.RESERVE).unlink(missing_ok=True)

    def write_records(self, recorder: Recorder) -> None:
        """Write the record tables (parquet) from everything recorded."""
        write_table(self.path / "steps.parquet", list(recorder.steps), STEP_COLUMNS)
        write_table(self.path / "updates.parquet", list(recorder.updates), UPDATE_COLUMNS)
        write_table(self.path / "events.parquet", list(recorder.events), EVENT_COLUMNS)

    def write_evals(self, points: pd.DataFrame) -> None:
        """evals.parquet: one row per evaluated version, placed on the run's clock (analysis.evals)."""
        meta = {b"testbed_schema_version": str(SCHEMA_VERSION).encode()}

        def w(tmp: Path) -> None:
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.Table.from_pandas(points, preserve_index=False)
            pq.write_table(table.replace_schema_metadata(meta), tmp)

        _atomic_write(self.path / "evals.parquet", w)

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


def run_table(path: str | os.PathLike, name: str) -> pd.DataFrame:
    """One record table of a run folder ("steps", "updates", "events"): its parquet file, or, for
    a run that never ended, the same table rebuilt from records.jsonl."""
    p = Path(path)
    if (p / f"{name}.parquet").exists():
        return pd.read_parquet(p / f"{name}.parquet")
    log = read_log(p / RecordLog.NAME) if (p / RecordLog.NAME).exists() else {name: []}
    return table_frame(log[name], TABLES[name])


def load_run(path: str | os.PathLike) -> dict[str, Any]:
    """Read a run folder back: config, summary, tables (DataFrames) and params.

    A run that never finished (killed, machine lost) has no tables or summary: its tables come
    from records.jsonl and `status` says "crashed".
    """
    p = Path(path)
    out: dict[str, Any] = {
        "config": json.loads((p / "config.json").read_text()),
        "summary": json.loads((p / "summary.json").read_text()) if (p / "summary.json").exists() else None,
    }
    for name in TABLES:
        out[name] = run_table(p, name)
    out["evals"] = _evals(p, out["config"], out["updates"], out["steps"])
    out["status"] = out["summary"]["status"] if out["summary"] else "crashed"
    if (p / "params.npz").exists():
        with np.load(p / "params.npz", allow_pickle=False) as npz:
            out["params"] = {k: npz[k] for k in npz.files}
    return out


def run_evals(path: str | os.PathLike) -> pd.DataFrame:
    """A run folder's evaluations (evals.parquet, or rebuilt for a run that never ended)."""
    p = Path(path)
    if (p / "evals.parquet").exists():
        return pd.read_parquet(p / "evals.parquet")
    config = json.loads((p / "config.json").read_text())
    return _evals(p, config, run_table(p, "updates"), run_table(p, "steps"))


def _evals(p: Path, config: dict[str, Any], updates: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """evals.parquet, or, for a run that never ended, its raw evaluations placed on its clock."""
    from testbed.analysis.evals import eval_points

    if (p / "evals.parquet").exists():
        return pd.read_parquet(p / "evals.parquet")
    raw = read_log(p / RecordLog.NAME)["evals"] if (p / RecordLog.NAME).exists() else []
    batch = config.get("config", {}).get("workload", {}).get("batch_size", 1)
    return eval_points(table_frame(raw, EVAL_COLUMNS), updates, steps, int(batch))


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
