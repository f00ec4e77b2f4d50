"""A grid of runs from a TOML spec -> one tidy table + figures. Resumable.

    python -m testbed.sweep experiments/scaling.toml [--out results/sweeps] [--quiet]

Spec (keys are RunConfig field names; sub-configs as dotted keys or tables; `workload` alone
is the workload name; the string "none" is None for optional keys such as ps.staleness_bound):

    name = "scaling"                 # optional, defaults to the file stem
    repeats = 1
    [base]                           # applies to every point
    workload = "synthetic"
    "workload.grad_mb" = 4
    [grid]                           # cartesian product, in the order written
    strategy = ["mapreduce", "ring"]
    workers = [1, 2, 4]

Every point is validated before Ray starts (one stderr line naming the key and the fix, exit 2).
A family-specific key that does not apply to a point's strategy (ps.* off the parameter
server, ps.staleness_bound off ps-async, ps.backup_workers off ps-sync, ring.* off allreduce)
is reset to its default for that point; a combination that thereby repeats an earlier point is
not run again but recorded as "skipped" in points.jsonl (and left out of runs.parquet).

Each point x repeat runs through `testbed.session.execute`, exactly the single-run code path,
on one Ray instance shared by the whole sweep. Repeat r of every point runs before repeat r+1,
so slow drift of the machine does not bias one point; repeats keep the seed (grid over `seed`
for different data orders). Point ids hash the resolved config and the repeat index, and
`points.jsonl` gets a line as each point ends, so a rerun skips completed points and retries
failed or interrupted ones. Exit code: 0 all completed, 1 some failed, 2 bad spec, 130 Ctrl-C.

    <out>/<name>/points.jsonl    one line per finished point: id, status, run folder, error
    <out>/<name>/runs/<run_id>/  the run folders (see results/README.md)
    <out>/<name>/runs.parquet    one row per run: flattened config + scalar summary metrics
    <out>/<name>/figures/        PNG + SVG from testbed.plots
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.config import ConfigError, RunConfig, validate, with_overrides

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

SPEC_KEYS = ("name", "repeats", "base", "grid")
SWEEP_OWNED = ("out", "quiet")  # the sweep sets these for every point
# Summary keys that repeat a config column, or would be ambiguous beside one.
SUMMARY_RENAMES = {"steps": "steps_applied", "status": "run_status"}
SUMMARY_DROPPED = ("strategy", "workers", "workload", "schema_version")


def config_keys() -> dict[str, str]:
    """Every settable spec key (dotted for sub-configs) -> its type annotation."""
    keys: dict[str, str] = {}
    for f in dataclasses.fields(RunConfig):
        if f.name in SWEEP_OWNED:
            continue
        if dataclasses.is_dataclass(f.default_factory):
            sub = dataclasses.fields(f.default_factory)
            keys.update({f"{f.name}.{s.name}": str(s.type) for s in sub})
        else:
            keys[f.name] = str(f.type)
    return keys


def applies(key: str, strategy: str, family: str | None) -> bool:
    """Whether a family-specific key means anything for this strategy."""
    if key.startswith("ps."):
        only = {"ps.staleness_bound": "ps-async", "ps.backup_workers": "ps-sync"}.get(key)
        return family == "ps" and (only is None or strategy == only)
    if key.startswith("ring."):
        return family == "allreduce"
    return True


# ---------------------------------------------------------------- spec


@dataclass(frozen=True)
class Spec:
    name: str
    repeats: int
    base: dict[str, Any]
    grid: dict[str, list[Any]]
    path: Path


@dataclass(frozen=True)
class Point:
    point_id: str
    repeat: int
    config: RunConfig
    values: dict[str, Any]  # this point's grid values, for labels


def load_spec(path: str | os.PathLike) -> Spec:
    """Read and check a spec file; raise ConfigError naming the key and the fix."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the spec ({exc.strerror}); check the path") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML ({exc}); fix the syntax") from None
    for key in data:
        if key not in SPEC_KEYS:
            raise ConfigError(f"{p}: key {key!r} is unknown; use {', '.join(SPEC_KEYS)}")
    name = data.get("name", p.stem)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ConfigError(f"{p}: name {name!r} must be a folder name of letters, digits, . _ -")
    repeats = data.get("repeats", 1)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= 1000:
        raise ConfigError(f"{p}: repeats {repeats!r} must be an integer in 1..1000, e.g. 3")
    base = _section(data, "base", p)
    grid = _section(data, "grid", p)
    for key, values in grid.items():
        if not isinstance(values, list):
            raise ConfigError(f"{p}: grid.{key} = {values!r} must be a list; "
                              f"write [{values!r}] or move it to [base]")
        if not values:
            raise ConfigError(f"{p}: grid.{key} is an empty list; give at least one value or remove it")
        grid[key] = [_coerce(key, v, f"{p}: grid.{key}") for v in values]
        if key in base:
            raise ConfigError(f"{p}: {key} is in both [base] and [grid]; keep one")
    base = {k: _coerce(k, v, f"{p}: base.{k}") for k, v in base.items()}
    return Spec(name, repeats, base, grid, p)


def _section(data: Mapping[str, Any], section: str, p: Path) -> dict[str, Any]:
    table = data.get(section, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{p}: {section} must be a table, e.g. [{section}]")
    flat: dict[str, Any] = {}
    _flatten(table, "", flat, f"{p}: {section}")
    known = config_keys()
    for key in flat:
        if key not in known:
            hint = "set by the sweep (--out)" if key in SWEEP_OWNED else "unknown"
            raise ConfigError(f"{p}: {section}.{key} is {hint}; use RunConfig keys such as "
                              "strategy, workers, workload.grad_mb, ps.shards, network.bandwidth")
    return flat


def _flatten(table: Mapping[str, Any], prefix: str, out: dict[str, Any], where: str) -> None:
    for key, value in table.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict):
            _flatten(value, f"{full}.", out, where)
            continue
        full = "workload.name" if full == "workload" else full  # `workload = "mlp"` names it
        if full in out:
            raise ConfigError(f"{where}.{full} is given twice; keep one")
        out[full] = value


def _coerce(key: str, value: Any, where: str) -> Any:
    """Check a value against the field's type; "none" -> None for optional fields."""
    kind = config_keys()[key]
    optional = "None" in kind
    if optional and isinstance(value, str) and value.lower() == "none":
        return None
    base = kind.split("|")[0].strip()
    ok = {"bool": isinstance(value, bool), "str": isinstance(value, str),
          "int": isinstance(value, int) and not isinstance(value, bool),
          "float": isinstance(value, (int, float)) and not isinstance(value, bool)}[base]
    if not ok:
        extra = ' or "none"' if optional else ""
        raise ConfigError(f"{where} = {value!r}: expected {base}{extra}; fix the value in the spec")
    return float(value) if base == "float" else value  # 4 and 4.0 give the same point id


# ---------------------------------------------------------------- points


def expand(spec: Spec, families: Mapping[str, str], runs_dir: str) -> tuple[list[Point], list[dict]]:
    """Grid -> validated points (repeat-major) and the skipped duplicate combinations."""
    keys = list(spec.grid)
    configs: list[tuple[RunConfig, dict[str, Any]]] = []
    seen: dict[str, dict[str, Any]] = {}
    skipped: list[dict[str, Any]] = []
    for combo in itertools.product(*spec.grid.values()):
        values = dict(zip(keys, combo, strict=True))
        cfg = _resolve(spec, {**spec.base, **values}, families, runs_dir)
        digest = _digest(cfg, None)
        if digest in seen:
            skipped.append({"values": values, "same_as": seen[digest]})
            continue
        seen[digest] = values
        configs.append((cfg, values))
    points = [Point(_digest(cfg, r), r, cfg, values)
              for r in range(spec.repeats) for cfg, values in configs]
    return points, skipped


def _resolve(spec: Spec, values: dict[str, Any], families: Mapping[str, str],
             runs_dir: str) -> RunConfig:
    strategy = values.get("strategy", RunConfig.strategy)
    family = families.get(strategy)
    kept = {k: v for k, v in values.items() if applies(k, strategy, family)}
    cfg = with_overrides(RunConfig(out=runs_dir, quiet=True), **kept)
    try:
        return validate(cfg, families)
    except ConfigError as exc:
        grid = ", ".join(f"{k}={values[k]!r}" for k in spec.grid)
        raise ConfigError(f"{spec.path}: point {{{grid}}}: {exc}") from None


def _digest(cfg: RunConfig, repeat: int | None) -> str:
    data = {k: v for k, v in cfg.to_dict().items() if k not in SWEEP_OWNED}
    text = json.dumps({"config": data, "repeat": repeat}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def flat_config(cfg: RunConfig) -> dict[str, Any]:
    """RunConfig -> {dotted key: value} over the settable keys."""
    d = cfg.to_dict()
    return {k: (d[k.split(".")[0]][k.split(".")[1]] if "." in k else d[k]) for k in config_keys()}


# ---------------------------------------------------------------- running


def read_points(path: Path) -> dict[str, dict[str, Any]]:
    """points.jsonl -> {point id: its latest record}; a torn last line is ignored."""
    records: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a crash mid-append; that point simply runs again
            if isinstance(rec, dict) and "id" in rec:
                records[rec["id"]] = rec
    return records


def _append(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(record, sort_keys=True, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())  # a finished point must survive a crash of the next one


def run_point(point: Point, runs_dir: Path) -> dict[str, Any]:
    """Execute one point through the single-run code path; return its points.jsonl record."""
    from testbed.session import execute

    attempt = 0
    while (runs_dir / f"{point.point_id}-{attempt}").exists():
        attempt += 1  # a run folder is never overwritten; a retry gets the next name
    run_id = f"{point.point_id}-{attempt}"
    record: dict[str, Any] = {"id": point.point_id, "repeat": point.repeat, "values": point.values}
    try:
        outcome = execute(point.config, run_id=run_id)
    except KeyboardInterrupt:
        return {**record, "status": "interrupted", "run_dir": None, "error": "interrupted"}
    except Exception as exc:  # noqa: BLE001 - one point fails, the sweep goes on
        return {**record, "status": "failed", "run_dir": None, "error": f"{type(exc).__name__}: {exc}"}
    status = {0: "completed", 130: "interrupted"}.get(outcome.exit_code, "failed")
    run_dir = f"runs/{outcome.folder.name}" if outcome.folder is not None else None
    return {**record, "status": status, "run_dir": run_dir, "error": outcome.error_line}


def _start_ray(points: list[Point]) -> bool:
    """Start (or attach to) one Ray for the whole sweep; True if this call started it."""
    import ray

    if ray.is_initialized():
        return False
    addresses = {p.config.cluster.address for p in points}
    if len(addresses) > 1:
        raise ConfigError(f"cluster.address {sorted(map(str, addresses))}: one sweep runs on one "
                          "cluster; put cluster.address in [base]")
    address = addresses.pop() or os.environ.get("RAY_ADDRESS") or None
    try:
        if address is None:
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, configure_logging=False,
                     _node_ip_address="127.0.0.1")
        else:
            ray.init(address=address, include_dashboard=False, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"cluster.address {address!r}: cannot start or reach Ray ({exc}); "
                          "start a head with 'ray start --head' or drop the address") from None
    return True


def run_all(todo: list[Point], total: int, sweep_dir: Path, quiet: bool) -> bool:
    """Run the points still to do, appending to points.jsonl; False if interrupted."""
    bar = None
    if not quiet:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=total - len(todo), desc=sweep_dir.name, unit="run",
                   dynamic_ncols=True)
    try:
        for point in todo:
            if bar is not None:
                bar.set_postfix_str(_point_label(point), refresh=True)
            record = run_point(point, sweep_dir / "runs")
            if record["status"] == "interrupted":
                return False  # not recorded: the point runs again on resume
            _append(sweep_dir / "points.jsonl", record)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return True


def _point_label(point: Point) -> str:
    return " ".join(f"{k.split('.')[-1]}={v}" for k, v in point.values.items()) + f" #{point.repeat}"


# ---------------------------------------------------------------- table


def build_table(spec: Spec, points: list[Point], records: Mapping[str, dict], sweep_dir: Path,
                families: Mapping[str, str]) -> pd.DataFrame:
    """One row per recorded run of this spec: flattened config + scalar summary metrics."""
    rows = []
    for p in points:
        rec = records.get(p.point_id)
        if rec is None or rec.get("status") not in ("completed", "failed"):
            continue
        row: dict[str, Any] = {"sweep": spec.name, "point_id": p.point_id, "repeat": p.repeat,
                               "status": rec["status"], "run_dir": rec.get("run_dir"),
                               "error": rec.get("error"), "family": families.get(p.config.strategy)}
        row.update(flat_config(p.config))
        summary_path = sweep_dir / rec["run_dir"] / "summary.json" if rec.get("run_dir") else None
        if summary_path is not None and summary_path.exists():
            row.update(_metrics(json.loads(summary_path.read_text())))
        rows.append(row)
    return _arrow_safe(pd.DataFrame(rows))


def _metrics(summary: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in summary.items():
        if key in SUMMARY_DROPPED:
            continue
        if isinstance(value, (dict, list)):
            value = json.dumps(value, sort_keys=True)  # keep it, as text, in a scalar column
        out[SUMMARY_RENAMES.get(key, key)] = value
    return out


def _arrow_safe(df: pd.DataFrame) -> pd.DataFrame:
    """JSON-encode object columns that mix types (parquet needs one type per column)."""
    for col in [c for c in df.columns if pd.api.types.is_object_dtype(df[c])]:
        kinds = {type(v).__name__ for v in df[col] if v is not None and v == v}
        if len(kinds - {"int", "float"}) > 1 or (kinds & {"int", "float"} and kinds - {"int", "float"}):
            df[col] = [None if v is None or v != v else json.dumps(v, default=str) for v in df[col]]
    return df


def write_table(df: pd.DataFrame, path: Path, spec: Spec) -> None:
    """Write runs.parquet atomically, with the schema version and the grid in its metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from testbed.results import SCHEMA_VERSION

    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = {b"testbed_schema_version": str(SCHEMA_VERSION).encode(),
            b"testbed_sweep": json.dumps({"name": spec.name, "grid": list(spec.grid),
                                          "repeats": spec.repeats}).encode()}
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def load_table(sweep_dir: str | os.PathLike) -> pd.DataFrame:
    """Read a sweep's runs.parquet; run_dir becomes absolute; df.attrs["sweep"] has the grid."""
    import pyarrow.parquet as pq

    path = Path(sweep_dir)
    path = path if path.suffix == ".parquet" else path / "runs.parquet"
    table = pq.read_table(path)
    df = table.to_pandas()
    if "run_dir" in df.columns:
        df["run_dir"] = [None if d is None else str(path.parent / d) for d in df["run_dir"]]
    meta = (table.schema.metadata or {}).get(b"testbed_sweep")
    df.attrs["sweep"] = json.loads(meta) if meta else {}
    return df


def run_tables(table: pd.DataFrame, kind: str, *, repeat: int = 0) -> dict[str, pd.DataFrame]:
    """{series label: steps or updates table} for the completed runs of one repeat."""
    from testbed.plots import series_labels

    rows = table[(table["status"] == "completed") & (table["repeat"] == repeat)]
    labels = series_labels(rows, exclude=())
    return {labels[i]: pd.read_parquet(Path(rows.at[i, "run_dir"]) / f"{kind}.parquet")
            for i in rows.index if (Path(rows.at[i, "run_dir"]) / f"{kind}.parquet").exists()}


# ---------------------------------------------------------------- CLI


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise ConfigError(message)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = _Parser(prog="python -m testbed.sweep", description=__doc__.split("\n")[0])
    p.add_argument("spec", help="experiments/NAME.toml")
    p.add_argument("--out", default="results/sweeps", help="folder that receives <name>/")
    p.add_argument("--quiet", action="store_true", help="no progress bar; print only the folder")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from testbed import registry

    try:
        args = _parse(argv)
        spec = load_spec(args.spec)
        sweep_dir = Path(args.out) / spec.name
        families = registry.families()
        points, skipped = expand(spec, families, str(sweep_dir / "runs"))
        sweep_dir.mkdir(parents=True, exist_ok=True)
    except (ConfigError, OSError) as exc:
        print(f"testbed.sweep: error: {exc}", file=sys.stderr)
        return 2
    records = read_points(sweep_dir / "points.jsonl")
    for s in skipped:  # recorded once, so points.jsonl says why a combination did not run
        sid = hashlib.sha256(json.dumps(s["values"], sort_keys=True).encode()).hexdigest()[:12]
        if sid not in records:
            _append(sweep_dir / "points.jsonl", {"id": sid, "status": "skipped", **s})
    todo = [p for p in points if not _done(records.get(p.point_id), sweep_dir)]
    return _finish(spec, points, todo, skipped, sweep_dir, families, args.quiet)


def _done(record: dict[str, Any] | None, sweep_dir: Path) -> bool:
    """Completed, and its run folder still has a summary (a deleted folder runs again)."""
    return bool(record and record.get("status") == "completed" and record.get("run_dir")
                and (sweep_dir / record["run_dir"] / "summary.json").exists())


def _finish(spec: Spec, points: list[Point], todo: list[Point], skipped: list[dict],
            sweep_dir: Path, families: Mapping[str, str], quiet: bool) -> int:
    import ray

    started, complete = False, True
    try:
        if todo:
            started = _start_ray(todo)
        complete = run_all(todo, len(points), sweep_dir, quiet)
    except ConfigError as exc:
        print(f"testbed.sweep: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        complete = False
    finally:
        if started:
            ray.shutdown()  # only the Ray this sweep started
    records = read_points(sweep_dir / "points.jsonl")
    table = build_table(spec, points, records, sweep_dir, families)
    write_table(table, sweep_dir / "runs.parquet", spec)
    _figures(sweep_dir)
    failed = int((table["status"] == "failed").sum()) if len(table) else 0
    if not quiet:
        print(f"{spec.name}: {len(table)} runs ({len(table) - failed} completed, {failed} failed), "
              f"{len(points) - len(todo)} reused, {len(skipped)} skipped as duplicates")
    print(sweep_dir)
    return 130 if not complete else (1 if failed else 0)


def _figures(sweep_dir: Path) -> None:
    from testbed import plots

    table = load_table(sweep_dir)
    if table.empty:
        return
    try:
        plots.figures_for_sweep(table, sweep_dir / "figures", steps_by_label=run_tables(table, "steps"),
                                updates_by_label=run_tables(table, "updates"))
    except Exception as exc:  # noqa: BLE001 - the table is written; say why figures are not
        print(f"testbed.sweep: warning: figures not drawn ({type(exc).__name__}: {exc})",
              file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
